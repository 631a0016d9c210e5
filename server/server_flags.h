// File: server/server_flags.h
//
// attention-server's command line beyond the flags server_main.cc defines:
// its --help text and parsing (--help and the other help flags print and
// exit 0, not 1 as Abseil's ParseCommandLine does), the range of every
// numeric flag (a value out of range is refused naming the flag, the value
// and what it may be, never clamped or taken silently), and the flags
// defined here (--exit_on_error), so that main() stays short.
//
// For main() only; thread-safe (as absl::GetFlag is) once flags are parsed.
#ifndef ATTENTION_SERVER_SERVER_FLAGS_H_
#define ATTENTION_SERVER_SERVER_FLAGS_H_

#include "absl/status/status.h"

namespace attention::server {

// Sets the usage text, the version and which flags --help lists (this
// file's and server_main.cc's). Before the flags are parsed.
void ConfigureUsage();

// Parses argv into the flags. A help flag (--help, --helpfull, --helpshort,
// --helppackage, --helpon, --helpmatch) prints its text to stdout and exits
// 0, as does --version; an unknown flag or a malformed value prints
// Abseil's message and exits 1. After ConfigureUsage.
void ParseServerFlags(int argc, char** argv);

// OK when every numeric flag is within its range; else InvalidArgument
// "--<flag>=<value>: expected <range> (<what an end means>)" for the first
// that is not, e.g. "--threads=-1: expected 0 to 4096 (0: every core)".
absl::Status CheckFlagRanges();

// --exit_on_error: a model folder that fails to load at start stops the start-up.
bool ExitOnErrorFlag();

}  // namespace attention::server

#endif  // ATTENTION_SERVER_SERVER_FLAGS_H_
