#include "tests/fuzz/oip_request_gen.h"

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "core/dtype.h"

namespace attention::fuzz {
namespace {

using Request = inference::ModelInferRequest;

const char* const kDatatypes[] = {"FP32", "FP16", "BF16", "BOOL", "INT8"};
// Values beyond this many in one tensor follow a fixed pattern instead of
// taking the input's bytes (which the later decisions need).
constexpr int64_t kMaxReadValues = 512;

// `count` values in the wire encoding of `datatype` (raw little-endian bytes).
std::string RawValues(FuzzInput& in, const std::string& datatype, int64_t count) {
  std::string out;
  for (int64_t i = 0; i < count; ++i) {
    const float v =
        i < kMaxReadValues ? in.Value() : 0.25f * static_cast<float>(i * 7 % 11) - 1.25f;
    if (datatype == "BOOL" || datatype == "INT8") {
      out.push_back(v > 0 ? 1 : 0);
    } else if (datatype == "FP32") {
      out.append(reinterpret_cast<const char*>(&v), sizeof(v));
    } else {
      const uint16_t h = datatype == "FP16" ? FloatToHalf(v) : FloatToBFloat16(v);
      out.append(reinterpret_cast<const char*>(&h), sizeof(h));
    }
  }
  return out;
}

// Adds input `name` of `shape` to `r`: mostly `datatype` with the right
// number of bytes, raw or (FP32, BOOL) typed; sometimes slightly wrong.
void AddInput(FuzzInput& in, Request* r, const std::string& name, std::string datatype,
              std::vector<int64_t> shape, bool raw) {
  if (in.Percent(3)) datatype = kDatatypes[in.Range(0, 4)];
  if (in.Percent(3) && !shape.empty()) shape[in.Range(0, shape.size() - 1)] += in.Bool() ? 1 : -1;
  if (in.Percent(2)) shape.push_back(1);
  auto* input = r->add_inputs();
  input->set_name(in.Percent(2) ? "Query" : name);
  input->set_datatype(datatype);
  int64_t count = 1;
  for (int64_t d : shape) {
    input->add_shape(d);
    count *= std::max<int64_t>(d, 0);
  }
  count = std::min<int64_t>(count, int64_t{1} << 22);
  if (in.Percent(3)) count += in.Bool() ? 1 : -1;
  if (raw) {
    *r->add_raw_input_contents() = RawValues(in, datatype, std::max<int64_t>(count, 0));
  } else if (datatype == "BOOL") {
    for (int64_t i = 0; i < count; ++i) {
      input->mutable_contents()->add_bool_contents(i < kMaxReadValues ? in.Bool() : i % 4 == 3);
    }
  } else {
    for (int64_t i = 0; i < count; ++i) {
      input->mutable_contents()->add_fp32_contents(i < kMaxReadValues ? in.Value() : 0.5f);
    }
  }
}

void SetBool(FuzzInput& in, Request* r, const char* name) {
  auto& p = (*r->mutable_parameters())[name];
  if (in.Percent(4)) {
    p.set_int64_param(1);  // The wrong type.
  } else {
    p.set_bool_param(in.Bool());
  }
}

// Triton's sequence parameters: ids from a small set (so that several
// requests of an input share a sequence), as string, uint64 or int64.
void SetSequence(FuzzInput& in, Request* r, bool first_of_id) {
  auto& params = *r->mutable_parameters();
  const uint8_t form = in.Byte() % 8;
  const int64_t which = in.Range(0, 2);
  if (form < 4) {
    params["sequence_id"].set_string_param(which == 2 ? (in.Bool() ? "" : std::string(4096, 's'))
                                                      : std::string(1, 'a' + which));
  } else if (form < 6) {
    params["sequence_id"].set_uint64_param(which == 2 ? (uint64_t{1} << 63) + 1 : which + 1);
  } else if (form == 6) {
    params["sequence_id"].set_int64_param(which == 2 ? -1 : which + 1);
  } else {
    params["sequence_id"].set_double_param(1.5);
  }
  if (first_of_id ? !in.Percent(10) : in.Percent(10)) params["sequence_start"].set_bool_param(true);
  if (in.Percent(20)) params["sequence_end"].set_bool_param(true);
}

// What the requests of one input share: with `shared`, one sequence (a
// pipelining client's steps: its id and model), else only whether some
// sequence has started.
struct SequencePlan {
  bool shared = false;
  bool started = false;
  int64_t pick = 0;
  inference::InferParameter id;
};

std::shared_ptr<Request> Generate(FuzzInput& in, const std::vector<OipModelShape>& models,
                                  bool roomy, SequencePlan* plan) {
  auto r = std::make_shared<Request>();
  const int64_t n = static_cast<int64_t>(models.size());
  const bool same = plan->shared && plan->started && !in.Percent(5);
  const int64_t pick = same ? plan->pick : in.Range(0, n + 1);
  plan->pick = pick;
  // 0: "", the default model (the first); 1..n: by name; n + 1: unknown.
  const OipModelShape& m = models[static_cast<size_t>(std::clamp<int64_t>(pick - 1, 0, n - 1))];
  if (pick == 0) {
    r->set_model_name("");
  } else if (pick <= n) {
    r->set_model_name(m.name);
  } else {
    r->set_model_name(in.Percent(10) ? std::string(static_cast<size_t>(in.Range(2, 8)) << 10, 'm')
                                     : in.Bytes(8));
  }
  if (in.Percent(5)) r->set_model_version(in.Bool() ? "1" : "2");
  if (in.Percent(20)) r->set_id(in.Bytes(16));
  if (in.Percent(3)) r->set_id(std::string(static_cast<size_t>(in.Range(1, 8)) << 10, 'i'));
  if (same) {
    auto& params = *r->mutable_parameters();
    params["sequence_id"] = plan->id;
    if (in.Percent(5)) params["sequence_start"].set_bool_param(true);
    if (in.Percent(10)) params["sequence_end"].set_bool_param(true);
  } else if (plan->shared || in.Percent(50)) {
    SetSequence(in, r.get(), !plan->started);
    plan->started = true;
    plan->id = r->parameters().at("sequence_id");
  }
  if (in.Percent(50)) SetBool(in, r.get(), "need_weights");
  if (in.Percent(25)) SetBool(in, r.get(), "average_attn_weights");
  if (in.Percent(20)) SetBool(in, r.get(), "is_causal");
  if (in.Percent(5)) {
    const int64_t us[] = {0, 1, 1000000000, -5};
    (*r->mutable_parameters())["timeout"].set_int64_param(us[in.Range(0, 3)]);
  }
  if (in.Percent(3)) (*r->mutable_parameters())["priority"].set_uint64_param(in.Byte());
  if (in.Percent(3)) (*r->mutable_parameters())["binary_data_output"].set_bool_param(true);

  // A batch of one mostly ([1, T, E]), else unbatched or of two.
  const uint8_t layout = in.Byte() % 8;
  const int64_t batch = layout < 5 ? 1 : layout < 7 ? 0 : 2;
  // Sometimes long (for the roomy server, sometimes large).
  const int64_t t = roomy && in.Percent(10) ? in.Range(65, 512)
                    : in.Percent(25)        ? in.Range(17, 64)
                                            : in.Range(1, 16);
  auto shape = [batch](int64_t rows, int64_t width) {
    std::vector<int64_t> s = {rows, width};
    if (batch > 0) s.insert(s.begin(), batch);
    return s;
  };
  const bool raw = !in.Percent(20);
  const uint8_t q_type = in.Byte() % 3;
  const std::string q_datatype = raw ? kDatatypes[q_type] : "FP32";
  AddInput(in, r.get(), "query", q_datatype, shape(t, m.embed_dim), raw);
  // Keys and values: what a cross model needs, sometimes for any model.
  int64_t s = t;
  const bool cross = m.kdim != m.embed_dim || m.vdim != m.embed_dim;
  if (cross ? !in.Percent(20) : in.Percent(15)) {
    s = roomy && in.Percent(10) ? in.Range(17, 4096) : in.Range(1, 16);
    AddInput(in, r.get(), "key", raw ? kDatatypes[in.Range(0, 2)] : "FP32", shape(s, m.kdim), raw);
    if (!in.Percent(20)) {
      AddInput(in, r.get(), "value", raw ? kDatatypes[in.Range(0, 2)] : "FP32", shape(s, m.vdim),
               raw);
    }
  }
  if (in.Percent(12)) {
    std::vector<int64_t> kpm = {s};
    if (batch > 0) kpm.insert(kpm.begin(), batch);
    AddInput(in, r.get(), "key_padding_mask", in.Bool() ? "BOOL" : "FP32", kpm, raw);
  }
  if (in.Percent(8)) AddInput(in, r.get(), "attn_mask", in.Bool() ? "BOOL" : "FP32", {t, s}, raw);

  const uint8_t outputs = in.Byte() % 6;
  if (outputs == 1 || outputs == 3) r->add_outputs()->set_name("output");
  if (outputs == 2 || outputs == 3 || outputs == 4) r->add_outputs()->set_name("attn_weights");
  if (outputs == 4) r->add_outputs()->set_name("output");
  if (outputs == 5) r->add_outputs()->set_name(in.Bool() ? "attn_weights" : "logits");
  if (outputs == 5 && in.Bool()) r->add_outputs()->set_name("attn_weights");
  return r;
}

}  // namespace

OipInput ReadOipRequests(FuzzInput& in, const std::vector<OipModelShape>& models) {
  OipInput input;
  std::vector<OipInputRequest>& out = input.requests;
  const uint8_t form = in.Byte();
  const int count = 1 + (form >> 1 & 7) % kMaxOipRequests;
  input.roomy = (form & 0x80) != 0;
  SequencePlan plan;
  if ((form & 1) != 0) plan.shared = in.Bool();
  for (int i = 0; i < count && (i == 0 || !in.empty()); ++i) {
    OipInputRequest r;
    if ((form & 1) != 0) {
      r.request = Generate(in, models, input.roomy, &plan);
    } else {
      // A 2-byte little-endian length, then that many bytes of protobuf.
      const size_t length = std::min<size_t>(in.Byte() | size_t{in.Byte()} << 8, in.remaining());
      r.request = std::make_shared<Request>();
      r.parsed = r.request->ParseFromArray(in.rest(), static_cast<int>(length));
      for (size_t k = 0; k < length; ++k) in.Byte();
    }
    out.push_back(std::move(r));
  }
  return input;
}

}  // namespace attention::fuzz
