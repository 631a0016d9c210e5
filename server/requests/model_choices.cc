#include "server/requests/model_choices.h"

#include <algorithm>
#include <cstddef>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "server/requests/identifiers.h"

namespace attention::server {
namespace {

constexpr size_t kListed = 20;
constexpr size_t kMaxDistance = 2;

// Levenshtein distance with adjacent swaps counted once (optimal string
// alignment), case-insensitive; stops early past kMaxDistance.
size_t Distance(absl::string_view a, absl::string_view b) {
  if (a.size() > b.size() + kMaxDistance || b.size() > a.size() + kMaxDistance) {
    return kMaxDistance + 1;
  }
  std::vector<std::vector<size_t>> d(a.size() + 1, std::vector<size_t>(b.size() + 1));
  for (size_t i = 0; i <= a.size(); ++i) d[i][0] = i;
  for (size_t j = 0; j <= b.size(); ++j) d[0][j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    for (size_t j = 1; j <= b.size(); ++j) {
      const bool same = absl::ascii_tolower(a[i - 1]) == absl::ascii_tolower(b[j - 1]);
      d[i][j] = std::min({d[i - 1][j] + 1, d[i][j - 1] + 1, d[i - 1][j - 1] + (same ? 0 : 1)});
      if (i > 1 && j > 1 && absl::ascii_tolower(a[i - 1]) == absl::ascii_tolower(b[j - 2]) &&
          absl::ascii_tolower(a[i - 2]) == absl::ascii_tolower(b[j - 1])) {
        d[i][j] = std::min(d[i][j], d[i - 2][j - 2] + 1);
      }
    }
  }
  return d[a.size()][b.size()];
}

}  // namespace

std::string ClosestModel(absl::string_view asked, const std::vector<std::string>& names) {
  if (asked.empty() || asked.size() > kMaxIdentifierBytes) return "";
  for (const std::string& n : names) {
    if (absl::EqualsIgnoreCase(n, asked)) return n;
  }
  for (const std::string& n : names) {
    if (absl::StartsWithIgnoreCase(n, asked) || absl::StartsWithIgnoreCase(asked, n)) return n;
  }
  std::string best;
  size_t best_distance = kMaxDistance + 1;
  for (const std::string& n : names) {
    const size_t d = Distance(asked, n);
    if (d < best_distance) {
      best = n;
      best_distance = d;
    }
  }
  return best;
}

std::string ModelChoices(absl::string_view asked, const std::vector<std::string>& names) {
  if (names.empty()) return "; no model is served to this caller";
  std::string text = "; models: ";
  if (names.size() <= kListed) {
    absl::StrAppend(&text, absl::StrJoin(names, ", "));
  } else {
    absl::StrAppend(&text, absl::StrJoin(names.begin(), names.begin() + kListed, ", "), " and ",
                    names.size() - kListed, " more");
  }
  const std::string closest = ClosestModel(asked, names);
  if (!closest.empty()) absl::StrAppend(&text, " (did you mean '", closest, "'?)");
  return text;
}

}  // namespace attention::server
