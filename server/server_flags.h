// File: server/server_flags.h
//
// attention-server's flags beyond those server_main.cc defines
// (--exit_on_error), read through functions, and its --help text, so that
// main() stays short.
//
// For main() only; thread-safe (as absl::GetFlag is) once flags are parsed.
#ifndef ATTENTION_SERVER_SERVER_FLAGS_H_
#define ATTENTION_SERVER_SERVER_FLAGS_H_

namespace attention::server {

// Sets the usage text, the version and which flags --help lists (this
// file's and server_main.cc's). Before the flags are parsed.
void ConfigureUsage();

// --exit_on_error: a model folder that fails to load at start stops the start-up.
bool ExitOnErrorFlag();

}  // namespace attention::server

#endif  // ATTENTION_SERVER_SERVER_FLAGS_H_
