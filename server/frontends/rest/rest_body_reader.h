// File: server/frontends/rest/rest_body_reader.h
//
// RestBodyReader: reads a REST request's body for a handler, within the
// message limit (413 past it, whatever the framing: Content-Length, chunked
// or compressed) and within the receive budget: bodies being read and parsed
// are charged before they are read (by their Content-Length) and as they
// grow, at kJsonCharge times their bytes for JSON (parsing takes about four
// times a body's size) and kBinaryCharge for the binary tensors after a
// body's JSON header (Inference-Header-Content-Length bytes, charged as JSON). A
// body the budget cannot take is refused with 429; what is left of it is
// read and dropped (nothing kept), so the client reads the answer and the
// connection stays in step. This is REST's counterpart of gRPC's resource quota:
// it bounds the memory of requests not yet admitted to the in-flight budget.
// Once stopped (the front-end is shutting down), bodies being read are cut
// off (503) at their next bytes: a client trickling one does not hold the
// shutdown.
//
// Thread-safe. The budget, when given, must outlive the reader and
// every charge it hands out.
#ifndef ATTENTION_SERVER_FRONTENDS_REST_REST_BODY_READER_H_
#define ATTENTION_SERVER_FRONTENDS_REST_REST_BODY_READER_H_

#include <httplib.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>

#include "server/requests/inflight_budget.h"

namespace attention::server {

class RestBodyReader {
 public:
  static constexpr int64_t kJsonCharge = 4;
  static constexpr int64_t kBinaryCharge = 2;

  // `budget` may be null: bodies are then only held to `max_body_bytes`.
  RestBodyReader(int64_t max_body_bytes, InflightBudget* budget)
      : max_body_(max_body_bytes), budget_(budget) {}

  // Reads the body into `body`, and the budget's bytes for it into `charge`
  // (hold it until the body and what was parsed from it are gone). False,
  // with the reply set, when the body is not read whole.
  bool Read(const httplib::Request& req, httplib::Response& res,
            const httplib::ContentReader& reader, std::string* body,
            std::shared_ptr<Admission>* charge) const;
  // Reads and drops a body no handler wants (DropBody); false when it was
  // not read whole (then close the connection after the reply).
  bool Drop(const httplib::Request& req, const httplib::ContentReader& reader) const;
  // Refuses the request with `status` without parsing its body: the body is
  // read and dropped (Drop), and the connection closed after the reply if it
  // was not read whole.
  void Refuse(const httplib::Request& req, httplib::Response& res,
              const httplib::ContentReader& reader, const absl::Status& status) const;
  // From now on, bodies being read or dropped are cut off.
  void Stop() { stopping_.store(true); }

 private:
  const int64_t max_body_;
  InflightBudget* const budget_;
  std::atomic<bool> stopping_{false};
};

}  // namespace attention::server

#endif  // ATTENTION_SERVER_FRONTENDS_REST_REST_BODY_READER_H_
