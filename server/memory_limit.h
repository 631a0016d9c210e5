// File: server/memory_limit.h
//
// The memory this process may use: its cgroup's limit (v2 memory.max, or v1
// memory.limit_in_bytes) when one is set, else the machine's physical
// memory. Defaults of memory budgets are fractions of it (see MemoryPlan).
// Also the process's own resident memory, now and at its peak.
//
// Reads /sys, /proc and sysconf on each call; safe from any thread.
#ifndef ATTENTION_SERVER_MEMORY_LIMIT_H_
#define ATTENTION_SERVER_MEMORY_LIMIT_H_

#include <cstdint>
#include <string>

namespace attention::server {

// Bytes; `source`, when given, says where the figure came from.
int64_t MemoryLimitBytes(std::string* source = nullptr);

// This process's resident set (VmRSS) and its peak (VmHWM), in bytes; 0 when
// /proc/self/status cannot be read.
int64_t ResidentBytes();
int64_t PeakResidentBytes();

}  // namespace attention::server

#endif  // ATTENTION_SERVER_MEMORY_LIMIT_H_
