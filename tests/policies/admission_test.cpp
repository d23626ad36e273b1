// The frontend's admission rule (policies/admission.h): a prompt must fit on the prefill side,
// prompt and output on the serving side and in the model's context.
#include "policies/admission.h"

#include <gtest/gtest.h>

#include <vector>

namespace duet::policies {
namespace {

const std::vector<InstanceRole> kPd = {InstanceRole::kPrefill, InstanceRole::kPrefill,
                                       InstanceRole::kDecode};

TEST(Admission, APdPromptNeedsThePrefillSideAndTheWholeRequestTheDecodeSide) {
  // Prefill instances admit 640 and 800 tokens, the decode instance 1280; context 4096.
  const auto limits = AdmissionLimits::For(kPd, std::vector<Tokens>{800, 640, 1280}, 4096, "m");
  EXPECT_EQ(limits.prefill, 640);
  EXPECT_EQ(limits.serve, 1280);
  EXPECT_EQ(limits.max_request_tokens(), 1280);
  EXPECT_EQ(limits.prompt_limit(), 640);
  EXPECT_FALSE(limits.Check(600, 600));  // more than a prefill instance holds, but only the
                                         // prompt is prefilled there
  EXPECT_FALSE(limits.Check(640, 640));
  auto prompt = limits.Check(641, 1);
  ASSERT_TRUE(prompt);
  EXPECT_EQ(*prompt, "exceeds KV capacity: needs 642 KV tokens; an instance admits at most 640");
  EXPECT_TRUE(limits.Check(600, 681));
  EXPECT_EQ(limits.RequiredOf(InstanceRole::kPrefill), 640);
  EXPECT_EQ(limits.RequiredOf(InstanceRole::kDecode), 1280);
}

TEST(Admission, ColocatedInstancesHoldTheWholeRequest) {
  const std::vector<InstanceRole> roles = {InstanceRole::kColocated, InstanceRole::kColocated};
  const auto limits = AdmissionLimits::For(roles, std::vector<Tokens>{900, 700}, 4096, "m");
  EXPECT_EQ(limits.max_request_tokens(), 700);
  EXPECT_FALSE(limits.Check(350, 350));
  EXPECT_TRUE(limits.Check(350, 351));
  EXPECT_EQ(limits.RequiredOf(InstanceRole::kColocated), 700);
}

TEST(Admission, TheContextComesFirstAndBoundsEverySide) {
  const auto limits = AdmissionLimits::For(kPd, std::vector<Tokens>{8000, 8000, 8000}, 1000, "m");
  EXPECT_EQ(limits.max_request_tokens(), 1000);
  EXPECT_EQ(limits.RequiredOf(InstanceRole::kPrefill), 1000);
  auto reason = limits.Check(900, 101);
  ASSERT_TRUE(reason);
  EXPECT_EQ(*reason,
            "exceeds the model's context: needs 1001 positions (prompt and output); m has "
            "max_position_embeddings 1000");
  // A context of 0 is none; an output past every bound does not overflow.
  const auto open = AdmissionLimits::For(kPd, std::vector<Tokens>{10, 10, 20}, 0, "m");
  EXPECT_EQ(open.max_request_tokens(), 20);
  EXPECT_TRUE(open.Check(5, AdmissionLimits::kNoLimit));
}

}  // namespace
}  // namespace duet::policies
