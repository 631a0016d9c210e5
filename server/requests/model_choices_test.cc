#include "server/requests/model_choices.h"

#include "gtest/gtest.h"

namespace attention::server {
namespace {

TEST(ModelChoicesTest, ATypoFindsTheModelItMeant) {
  const std::vector<std::string> names = {"demo", "encoder", "small"};
  EXPECT_EQ(ClosestModel("dmeo", names), "demo");       // Two letters swapped.
  EXPECT_EQ(ClosestModel("demoo", names), "demo");      // One added.
  EXPECT_EQ(ClosestModel("encder", names), "encoder");  // One left out.
  EXPECT_EQ(ClosestModel("Small", names), "small");     // Case.
  EXPECT_EQ(ClosestModel("enc", names), "encoder");     // A prefix.
  EXPECT_EQ(ClosestModel("bert", names), "");           // Nothing close.
  EXPECT_EQ(ClosestModel("", names), "");
}

TEST(ModelChoicesTest, ListsTheModelsAndTheClosest) {
  EXPECT_EQ(ModelChoices("dmeo", {"demo", "small"}),
            "; models: demo, small (did you mean 'demo'?)");
  EXPECT_EQ(ModelChoices("bert", {"demo", "small"}), "; models: demo, small");
  EXPECT_EQ(ModelChoices("bert", {}), "; no model is served to this caller");
  std::vector<std::string> many;
  for (int i = 0; i < 25; ++i) many.push_back("m" + std::to_string(100 + i));
  const std::string listed = ModelChoices("x", many);
  EXPECT_NE(listed.find("m119 and 5 more"), std::string::npos) << listed;
  EXPECT_EQ(listed.find("m120"), std::string::npos) << listed;
}

}  // namespace
}  // namespace attention::server
