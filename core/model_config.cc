#include "core/model_config.h"

#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"

namespace attention {
namespace {

absl::Status KeyError(absl::string_view key, absl::string_view expected,
                      const nlohmann::json& actual) {
  return absl::InvalidArgumentError(
      absl::StrCat("config.json: '", key, "' must be ", expected, ", got ", actual.dump()));
}

absl::StatusOr<int64_t> ReadInt(const nlohmann::json& j, absl::string_view key, int64_t min) {
  const nlohmann::json& v = j.at(std::string(key));
  if (!v.is_number_integer() || v.get<int64_t>() < min) {
    return KeyError(key, absl::StrCat("an integer >= ", min), v);
  }
  return v.get<int64_t>();
}

absl::StatusOr<bool> ReadBool(const nlohmann::json& j, absl::string_view key) {
  const nlohmann::json& v = j.at(std::string(key));
  if (!v.is_boolean()) return KeyError(key, "true or false", v);
  return v.get<bool>();
}

}  // namespace

absl::StatusOr<ModelConfig> ParseModelConfig(absl::string_view json_text) {
  nlohmann::json j = nlohmann::json::parse(json_text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return absl::InvalidArgumentError("config.json: not valid JSON");
  if (!j.is_object()) return absl::InvalidArgumentError("config.json: not a JSON object");
  if (!j.contains("num_heads")) {
    return absl::InvalidArgumentError("config.json: 'num_heads' is required");
  }
  ModelConfig c;
  for (auto it = j.begin(); it != j.end(); ++it) {
    const std::string& key = it.key();
    absl::Status status;
    auto set_int = [&](std::optional<int64_t>& field, int64_t min) {
      auto v = ReadInt(j, key, min);
      if (v.ok()) field = *v;
      status = v.status();
    };
    auto set_bool = [&](std::optional<bool>& field) {
      auto v = ReadBool(j, key);
      if (v.ok()) field = *v;
      status = v.status();
    };
    if (key == "num_heads") {
      auto v = ReadInt(j, key, 1);
      if (v.ok()) c.num_heads = *v;
      status = v.status();
    } else if (key == "embed_dim") {
      set_int(c.embed_dim, 1);
    } else if (key == "kdim") {
      set_int(c.kdim, 1);
    } else if (key == "vdim") {
      set_int(c.vdim, 1);
    } else if (key == "bias") {
      set_bool(c.bias);
    } else if (key == "add_bias_kv") {
      set_bool(c.add_bias_kv);
    } else if (key == "add_zero_attn") {
      std::optional<bool> v;
      set_bool(v);
      c.add_zero_attn = v.value_or(false);
    } else if (key == "compute_dtype") {
      if (!it.value().is_string() ||
          (it.value() != "float32" && it.value() != "bfloat16" && it.value() != "int8")) {
        status = KeyError(key, "\"float32\", \"bfloat16\" or \"int8\"", it.value());
      } else {
        c.compute_dtype = it.value() == "float32" ? DType::kFloat32 : DType::kBFloat16;
        c.int8_weights = it.value() == "int8";
      }
    } else if (key == "max_batch_size") {
      set_int(c.serving.max_batch_size, 1);
    } else if (key == "max_batch_tokens") {
      set_int(c.serving.max_batch_tokens, 1);
    } else if (key == "max_queue_delay_us") {
      set_int(c.serving.max_queue_delay_us, 0);
    } else if (key == "max_queue_size") {
      set_int(c.serving.max_queue_size, 1);
    } else if (key == "max_sessions") {
      set_int(c.serving.max_sessions, 0);
    } else if (key == "max_session_tokens") {
      set_int(c.serving.max_session_tokens, 1);
    } else if (key == "session_ttl_s") {
      set_int(c.serving.session_ttl_s, 1);
    } else if (key == "session_cache_dtype") {
      if (!it.value().is_string() || (it.value() != "float32" && it.value() != "bfloat16")) {
        status = KeyError(key, "\"float32\" or \"bfloat16\"", it.value());
      } else {
        c.serving.session_cache_dtype =
            it.value() == "float32" ? DType::kFloat32 : DType::kBFloat16;
      }
    } else if (key == "batch_first") {
      std::optional<bool> v;
      set_bool(v);
      c.serving.batch_first = v.value_or(true);
    } else {
      status = absl::InvalidArgumentError(absl::StrCat(
          "config.json: unknown key '", key,
          "': expected num_heads, embed_dim, kdim, vdim, bias, add_bias_kv, add_zero_attn, "
          "compute_dtype, max_batch_size, max_batch_tokens, max_queue_delay_us, "
          "max_queue_size, max_sessions, max_session_tokens, session_ttl_s, "
          "session_cache_dtype, batch_first"));
    }
    if (!status.ok()) return status;
  }
  if (c.embed_dim && *c.embed_dim % c.num_heads != 0) {
    return absl::InvalidArgumentError(absl::StrCat("config.json: embed_dim ", *c.embed_dim,
                                                   " is not divisible by num_heads ", c.num_heads));
  }
  return c;
}

}  // namespace attention
