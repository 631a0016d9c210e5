// File: server/metrics/metrics_port.h
//
// What the metrics port (prometheus-cpp's Exposer, on civetweb) answers
// besides /metrics: `/` a short text pointing to /metrics (200), any other
// path a 404 that says the same, instead of civetweb's bare 404. Installed
// as the Exposer's begin_request callback; /metrics (and below it) is left
// to the Exposer.
//
// The callbacks are a static, immutable value; thread-safe.
#ifndef ATTENTION_SERVER_METRICS_METRICS_PORT_H_
#define ATTENTION_SERVER_METRICS_METRICS_PORT_H_

struct CivetCallbacks;

namespace attention::server {

// For prometheus::Exposer's constructor; valid for the process's life.
const CivetCallbacks* MetricsPortCallbacks();

}  // namespace attention::server

#endif  // ATTENTION_SERVER_METRICS_METRICS_PORT_H_
