// File: tests/rest_test_fixture.h
//
// What the REST tests on the shared server fixture use (server_rest_test,
// server_rest_protocol_test): JSON tensors and outputs, a raw exchange on a
// new connection, and RestTest (ServerTest with an HTTP client of the REST
// port and the same inputs over gRPC's ModelInfer, to compare with).
#ifndef ATTENTION_TESTS_REST_TEST_FIXTURE_H_
#define ATTENTION_TESTS_REST_TEST_FIXTURE_H_

#include <arpa/inet.h>
#include <httplib.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstring>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "gtest/gtest.h"
#include "inference/grpc_predict_v2.grpc.pb.h"
#include "nlohmann/json.hpp"
#include "tests/server_fixture.h"

namespace attention {

using json = nlohmann::json;

inline json FloatsJson(const Tensor& t) {
  json data = json::array();
  for (int64_t i = 0; i < t.num_elements(); ++i) data.push_back(t.as<float>()[i]);
  return data;
}

inline json BoolsJson(const Tensor& t) {
  json data = json::array();
  for (int64_t i = 0; i < t.num_elements(); ++i) data.push_back(t.as<uint8_t>()[i] != 0);
  return data;
}

inline json Input(const std::string& name, const std::string& datatype, const Shape& shape,
                  json data) {
  return json{{"name", name}, {"datatype", datatype}, {"shape", shape}, {"data", std::move(data)}};
}

// The floats of output `name` in a JSON response.
inline std::vector<float> OutputData(const json& response, const std::string& name) {
  for (const json& o : response["outputs"]) {
    if (o["name"] == name) return o["data"].get<std::vector<float>>();
  }
  ADD_FAILURE() << "no output " << name << " in " << response.dump().substr(0, 300);
  return {};
}

// Sends `request` as is on a new connection and returns what comes back
// until the server closes it (or 5 s pass).
inline std::string RawExchange(int port, const std::string& request) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  timeval timeout{5, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof(timeout));
  std::string out;
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0 &&
      send(fd, request.data(), request.size(), 0) == static_cast<ssize_t>(request.size())) {
    char buf[4096];
    for (ssize_t n; (n = recv(fd, buf, sizeof(buf), 0)) > 0;) out.append(buf, n);
  }
  close(fd);
  return out;
}

class RestTest : public ServerTest {
 protected:
  httplib::Client Client() {
    httplib::Client client("127.0.0.1", server_->http_port());
    client.set_read_timeout(30, 0);
    return client;
  }
  httplib::Result PostJson(const std::string& path, const json& body) {
    return Client().Post(path.c_str(), body.dump(), "application/json");
  }
  // The same inputs over gRPC's ModelInfer, outputs as floats by name.
  std::map<std::string, std::vector<float>> GrpcInfer(
      const std::string& model, const std::vector<std::pair<std::string, const Tensor*>>& inputs,
      bool need_weights) {
    inference::ModelInferRequest r;
    r.set_model_name(model);
    for (const auto& [name, t] : inputs) {
      auto* in = r.add_inputs();
      in->set_name(name);
      in->set_datatype(t->dtype() == DType::kBool ? "BOOL" : "FP32");
      in->mutable_shape()->Assign(t->shape().begin(), t->shape().end());
      r.add_raw_input_contents(std::string(static_cast<const char*>(t->data()), t->num_bytes()));
    }
    if (need_weights) (*r.mutable_parameters())["need_weights"].set_bool_param(true);
    grpc::ClientContext context;
    inference::ModelInferResponse response;
    const grpc::Status status =
        inference::GRPCInferenceService::NewStub(*channel_)->ModelInfer(&context, r, &response);
    EXPECT_TRUE(status.ok()) << status.error_message();
    std::map<std::string, std::vector<float>> out;
    for (int i = 0; i < response.outputs_size() && status.ok(); ++i) {
      const std::string& bytes = response.raw_output_contents(i);
      std::vector<float> v(bytes.size() / 4);
      std::memcpy(v.data(), bytes.data(), bytes.size());
      out[response.outputs(i).name()] = v;
    }
    return out;
  }
};

}  // namespace attention

#endif  // ATTENTION_TESTS_REST_TEST_FIXTURE_H_
