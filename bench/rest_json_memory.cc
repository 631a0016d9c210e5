// attention-rest-json-memory: the peak memory of decoding one JSON infer body
// (server/frontends/rest/rest_codec.h), per body byte, in this process.
// The body is `{"inputs":[{"name":"query","datatype":"FP32","shape":[1,N,256],
// "data":[...]}]}` with N rows: `--values=zeros` writes `0,0,0,...` (the
// worst case: 2 body bytes per 4-byte float), `--values=floats` writes
// random floats in their shortest form (~11 bytes each).
//
//   attention-rest-json-memory --mib=64 --values=zeros [--decoder=codec|dom|ondemand]
//   attention-rest-json-memory --mib=0 --values=floats --repeat=20000  # small bodies' CPU
//
// `codec` is DecodeRestInfer; `dom` and `ondemand` parse the same body with
// simdjson's DOM and On-Demand APIs (summing the numbers, no tensor), for
// comparison. The peak is VmHWM (reset through /proc/self/clear_refs after
// the body is built) minus VmRSS before decoding: memory the decoder added,
// the tensor included, the body not. Prints one JSON line.
#include <simdjson.h>

#include <charconv>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <fstream>
#include <random>
#include <string>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_cat.h"
#include "server/frontends/rest/rest_codec.h"

ABSL_FLAG(int, mib, 64, "approximate body size in MiB");
ABSL_FLAG(std::string, values, "zeros", "zeros or floats");
ABSL_FLAG(std::string, decoder, "codec", "codec (DecodeRestInfer), dom or ondemand");
ABSL_FLAG(int, repeat, 1, "decodes, for the CPU rate of small bodies (--mib=0: one row)");

namespace {

// A field of /proc/self/status in bytes (VmRSS, VmHWM), or -1.
long long StatusBytes(const std::string& field) {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind(field + ":", 0) == 0) return std::stoll(line.substr(field.size() + 1)) * 1024;
  }
  return -1;
}

std::string Body(size_t target, bool zeros, long long* rows) {
  std::string data;
  data.reserve(target + 64);
  std::mt19937 rng(1);
  std::uniform_real_distribution<float> dist(-1.f, 1.f);
  char buf[32];
  long long n = 0;
  while (n == 0 || data.size() < target || n % 256 != 0) {
    if (n > 0) data.push_back(',');
    if (zeros) {
      data.push_back('0');
    } else {
      const auto end = std::to_chars(buf, buf + sizeof(buf), dist(rng)).ptr;
      data.append(buf, end);
    }
    ++n;
  }
  *rows = n / 256;
  std::string body = absl::StrCat(R"({"inputs":[{"name":"query","datatype":"FP32","shape":[1,)",
                                  *rows, R"(,256],"data":[)");
  body.reserve(body.size() + data.size() + 8 + simdjson::SIMDJSON_PADDING);
  body.append(data);
  body.append("]}]}");
  return body;
}

}  // namespace

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  long long rows = 0;
  const std::string body = Body(static_cast<size_t>(absl::GetFlag(FLAGS_mib)) << 20,
                                absl::GetFlag(FLAGS_values) == "zeros", &rows);
  const std::string decoder = absl::GetFlag(FLAGS_decoder);
  const long long before = StatusBytes("VmRSS");
  {
    std::ofstream clear("/proc/self/clear_refs");
    clear << "5";
  }
  const std::clock_t start = std::clock();  // CPU time: the machine may be shared.
  std::string outcome = "ok";
  size_t tensor = 0;
  for (int k = 1; k < absl::GetFlag(FLAGS_repeat) && decoder == "codec"; ++k) {
    (void)attention::server::DecodeRestInfer(body, std::nullopt, "m", "");
  }
  if (decoder == "codec") {
    absl::StatusOr<attention::server::RestInferRequest> r =
        attention::server::DecodeRestInfer(body, std::nullopt, "m", "");
    if (!r.ok()) {
      outcome = std::string(r.status().message().substr(0, 200));
    } else {
      tensor = r->request.raw_input_contents(0).size();
    }
  } else if (decoder == "dom") {
    simdjson::dom::parser parser;
    simdjson::dom::element root;
    if (parser.parse(body.data(), body.size(), true).get(root)) outcome = "parse error";
  } else {
    simdjson::ondemand::parser parser;
    simdjson::padded_string_view view(body.data(), body.size(), body.capacity());
    simdjson::ondemand::document doc;
    double sum = 0;
    if (parser.iterate(view).get(doc)) {
      outcome = "iterate error";
    } else {
      for (auto input : doc["inputs"]) {
        for (auto v : input["data"].get_array()) sum += double(v.get_double());
      }
    }
    tensor = sum == 12345 ? 1 : 0;  // Keeps the loop.
  }
  const double seconds = double(std::clock() - start) / CLOCKS_PER_SEC;
  const long long peak = StatusBytes("VmHWM");
  std::printf(
      "{\"decoder\":\"%s\",\"values\":\"%s\",\"body_bytes\":%zu,\"tensor_bytes\":%zu,"
      "\"rss_before\":%lld,\"peak_rise\":%lld,\"peak_rise_per_body_byte\":%.2f,"
      "\"with_body_per_body_byte\":%.2f,\"cpu_mb_per_s\":%.0f,\"outcome\":\"%s\"}\n",
      decoder.c_str(), absl::GetFlag(FLAGS_values).c_str(), body.size(), tensor, before,
      peak - before, double(peak - before) / body.size(),
      double(peak - before + body.size()) / body.size(),
      body.size() * double(absl::GetFlag(FLAGS_repeat)) / seconds / 1e6, outcome.c_str());
  return 0;
}
