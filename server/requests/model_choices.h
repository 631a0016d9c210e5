// File: server/requests/model_choices.h
//
// What a refusal of an unknown model name adds so that the caller can fix
// it: the models the caller may use and the closest of them to what it
// asked ("model: 'dmeo' is not served; models: demo, small (did you mean
// 'demo'?)"). Only names the caller may use are shown, so the text reveals
// nothing a token is not allowed to see.
//
// Stateless functions; thread-safe.
#ifndef ATTENTION_SERVER_REQUESTS_MODEL_CHOICES_H_
#define ATTENTION_SERVER_REQUESTS_MODEL_CHOICES_H_

#include <string>
#include <vector>

#include "absl/strings/string_view.h"

namespace attention::server {

// The name among `names` closest to `asked`: one that differs only in
// letter case, else one that starts with it or that it starts with
// (`dem` and `demo_v2` for `demo`), else the nearest within an edit distance
// of 2 (a typo: a letter changed, added, left out, or two swapped); ties go
// to the first. "" when none is close.
std::string ClosestModel(absl::string_view asked, const std::vector<std::string>& names);

// "; models: a, b (did you mean 'a'?)", "; models: a, b", or, with no
// model, "; no model is served to this caller". At most 20 names are listed
// (then "and N more"). `names` in the order to show.
std::string ModelChoices(absl::string_view asked, const std::vector<std::string>& names);

}  // namespace attention::server

#endif  // ATTENTION_SERVER_REQUESTS_MODEL_CHOICES_H_
