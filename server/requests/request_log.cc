#include "server/requests/request_log.h"

#include <string_view>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"

namespace attention::server {
namespace {

// Longest reason written: messages are already short (2 KiB at most), a log
// line is shorter still.
constexpr size_t kMaxReasonBytes = 512;

// `text` with control characters (a line break in a caller's id) as '?'.
std::string Printable(absl::string_view text) {
  std::string out(text);
  for (char& c : out) {
    if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f) c = '?';
  }
  return out;
}

// A model name as one field of the line: a caller's name of a model not
// served may hold anything, so every byte but letters, digits and ._-:/@+
// is '?', and it is cut to 128 bytes.
std::string Field(absl::string_view text) {
  if (text.empty()) return "-";
  std::string out(text.substr(0, 128));
  for (char& c : out) {
    if (!absl::ascii_isalnum(static_cast<unsigned char>(c)) &&
        std::string_view("._-:/@+").find(c) == std::string_view::npos) {
      c = '?';
    }
  }
  if (text.size() > 128) out += "...";
  return out;
}

}  // namespace

absl::string_view RequestLog::MethodPath(Method method) {
  switch (method) {
    case Method::kInfer:
      return "attention.v1.AttentionService/Infer";
    case Method::kInferStream:
      return "attention.v1.AttentionService/InferStream";
    case Method::kCreateSession:
      return "attention.v1.SessionService/CreateSession";
    case Method::kAppend:
      return "attention.v1.SessionService/Append";
    case Method::kSessionStream:
      return "attention.v1.SessionService/SessionStream";
    case Method::kGetSession:
      return "attention.v1.SessionService/GetSession";
    case Method::kCloseSession:
      return "attention.v1.SessionService/CloseSession";
    case Method::kModelInfer:
      return "inference.GRPCInferenceService/ModelInfer";
    case Method::kModelStreamInfer:
      return "inference.GRPCInferenceService/ModelStreamInfer";
    case Method::kRestModelInfer:
      return "POST /v2/models/{model}/infer";
  }
  return "unknown";
}

void RequestLog::Failed(Method method, absl::string_view model, absl::string_view caller,
                        absl::string_view peer, const absl::Status& status) {
  Failed(
      method, model, [caller] { return std::string(caller); }, peer, status);
}

void RequestLog::Failed(Method method, absl::string_view model,
                        absl::FunctionRef<std::string()> caller, absl::string_view peer,
                        const absl::Status& status) {
  const absl::Time now = clock_();
  int64_t held_back = 0;
  {
    absl::MutexLock lock(&mu_);
    // A new window each second, or when the clock was set back.
    if (now < window_start_ || now - window_start_ >= absl::Seconds(1)) {
      window_start_ = now;
      lines_in_window_ = 0;
    }
    if (lines_in_window_ >= lines_per_second_) {
      ++suppressed_;
      ++suppressed_total_;
      return;
    }
    ++lines_in_window_;
    held_back = suppressed_;
    suppressed_ = 0;
  }
  const std::string name = caller();
  absl::string_view reason = status.message();
  if (reason.size() > kMaxReasonBytes) reason = reason.substr(0, kMaxReasonBytes);
  std::string line = absl::StrCat(
      absl::FormatTime("%Y-%m-%dT%H:%M:%E3SZ", now, absl::UTCTimeZone()),
      " request failed: ", absl::StatusCodeToString(status.code()), " ", MethodPath(method),
      " model=", Field(model), " caller=", name.empty() ? "-" : name,
      " peer=", peer.empty() ? "-" : peer, ": ", Printable(reason));
  if (held_back > 0) absl::StrAppend(&line, " (and ", held_back, " more not logged)");
  line.push_back('\n');
  absl::MutexLock lock(&mu_);  // One line at a time.
  *out_ << line << std::flush;
}

int64_t RequestLog::suppressed_total() const {
  absl::MutexLock lock(&mu_);
  return suppressed_total_;
}

}  // namespace attention::server
