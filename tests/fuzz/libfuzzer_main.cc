// A libFuzzer target around one entry function (ATTENTION_FUZZ_ENTRY, set by
// tests/fuzz/CMakeLists.txt): a verdict that is a bug aborts, so libFuzzer
// saves the input.
#include <cstdio>
#include <cstdlib>
#include <string>

#include "tests/fuzz/fuzz_entries.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const absl::Status status = attention::fuzz::ATTENTION_FUZZ_ENTRY(data, size);
  if (attention::fuzz::IsFuzzBug(status)) {
    std::fprintf(stderr, "fuzz bug: %s\n", status.ToString().c_str());
    std::abort();
  }
  return 0;
}
