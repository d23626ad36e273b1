// The frontend policy (policies/frontend_policy.h): what becomes of a request that arrives and
// of one whose worker was lost, decided as data over a real router.
#include "policies/frontend_policy.h"

#include <gtest/gtest.h>

#include <memory>
#include <vector>

#include "policies/block_hash.h"

namespace duet::policies {
namespace {

using Verdict = FrontendDecision::Verdict;
using Recovery = RecoveryDecision::Verdict;

// 2P1D: prefill instances 0 and 1 admit 640 KV tokens, decode instance 2 1280; context 4096.
struct Pd {
  std::unique_ptr<Router> router = MakeRouter({}, {0, 1}, {2}, nullptr);
  FrontendPolicy policy{
      AdmissionLimits::For(std::vector<InstanceRole>{InstanceRole::kPrefill, InstanceRole::kPrefill,
                                                     InstanceRole::kDecode},
                           std::vector<Tokens>{640, 640, 1280}, 4096, "m"),
      *router};
};

Request Prompt(RequestId id, Tokens prompt, Tokens output) {
  Request r;
  r.id = id;
  r.input_tokens = prompt;
  r.output_tokens = output;
  for (Tokens t = 0; t < prompt; ++t) r.prompt_ids.push_back(static_cast<std::int32_t>(t % 50));
  r.block_hashes = TokenBlockHashes(r.prompt_ids, 16);
  return r;
}

TEST(FrontendPolicy, AdmitsAndRoutesOrSaysWhyNot) {
  Pd pd;
  Request fits = Prompt(0, 600, 600);  // more than a prefill instance holds, prompt aside
  const FrontendDecision d = pd.policy.Admit(fits);
  ASSERT_EQ(d.verdict, Verdict::kDispatch);
  EXPECT_EQ(d.prefill, 0);
  EXPECT_EQ(d.decode, 2);
  EXPECT_EQ(fits.prefill_instance, 0);
  EXPECT_EQ(fits.decode_instance, 2);
  EXPECT_EQ(pd.router->load(0).outstanding_requests, 1);
  EXPECT_EQ(pd.router->load(2).outstanding_requests, 1);

  Request prompt_too_long = Prompt(1, 641, 1);
  const FrontendDecision refused = pd.policy.Admit(prompt_too_long);
  EXPECT_EQ(refused.verdict, Verdict::kTooLong);
  EXPECT_EQ(refused.reason,
            "exceeds KV capacity: needs 642 KV tokens; an instance admits at most 640");
  EXPECT_EQ(prompt_too_long.prefill_instance, kNoInstance);
  Request empty = Prompt(2, 10, 0);
  EXPECT_EQ(pd.policy.Admit(empty).verdict, Verdict::kInvalid);

  // No decode instance left: the router refuses, and charges nothing.
  pd.router->SetAvailable(2, false);
  Request unroutable = Prompt(3, 100, 10);
  const FrontendDecision none = pd.policy.Admit(unroutable);
  EXPECT_EQ(none.verdict, Verdict::kUnroutable);
  EXPECT_FALSE(none.reason.empty());
  EXPECT_EQ(pd.router->load(1).outstanding_requests, 0);
  // Check alone reads nothing but the request.
  EXPECT_FALSE(pd.policy.Check(unroutable));
}

// A request sent to instance 0, which got `delivered` tokens out before its worker was lost.
Request Lost(Pd& pd, Tokens prompt, Tokens max_tokens, std::vector<std::int32_t> delivered) {
  Request r = Prompt(7, prompt, max_tokens);
  r.sampling.stop_token_ids = {99};
  EXPECT_TRUE(pd.policy.Admit(r).dispatched());
  r.output_ids = std::move(delivered);
  return r;
}

TEST(FrontendPolicy, ALostRequestContinuesElsewhereWithWhatItsClientGot) {
  Pd pd;
  const Request lost = Lost(pd, 100, 20, {5, 6, 7});
  pd.router->SetAvailable(0, false);  // the lost worker's instance
  RecoveryDecision d = pd.policy.Recover(lost, 40, /*tokens_before=*/2, 20, 1, 16);
  ASSERT_EQ(d.verdict, Recovery::kResend);
  ASSERT_TRUE(d.attempt);
  const Request& next = *d.attempt;
  EXPECT_EQ(next.id, 40);
  EXPECT_EQ(next.input_tokens, 103);
  EXPECT_EQ(std::vector<std::int32_t>(next.prompt_ids.end() - 3, next.prompt_ids.end()),
            (std::vector<std::int32_t>{5, 6, 7}));
  EXPECT_EQ(next.block_hashes, TokenBlockHashes(next.prompt_ids, 16));
  EXPECT_EQ(next.output_tokens, 20 - 2 - 3);
  EXPECT_EQ(next.sampling.stop_token_ids, lost.sampling.stop_token_ids);
  EXPECT_EQ(d.route.prefill, 1);  // the survivor
  EXPECT_EQ(next.prefill_instance, 1);
  // The lost attempt is uncharged; the new one charged.
  EXPECT_EQ(pd.router->load(0).outstanding_requests, 0);
  EXPECT_EQ(pd.router->load(1).outstanding_requests, 1);
  EXPECT_EQ(pd.router->load(2).outstanding_requests, 1);
}

TEST(FrontendPolicy, ALostRequestThatIsDoneOrLostTooOftenEnds) {
  {
    Pd pd;
    EXPECT_EQ(pd.policy.Recover(Lost(pd, 100, 5, {1, 2}), 40, 3, 5, 1, 16).verdict,
              Recovery::kEndLength);
    EXPECT_EQ(pd.router->load(0).outstanding_requests, 0);
  }
  {
    Pd pd;
    EXPECT_EQ(pd.policy.Recover(Lost(pd, 100, 20, {1, 99}), 40, 0, 20, 1, 16).verdict,
              Recovery::kEndStop);
  }
  {
    Pd pd;
    const Request lost = Lost(pd, 100, 20, {1});
    EXPECT_EQ(pd.policy.Recover(lost, 40, 0, 20, FrontendPolicy::kMaxWorkersLost, 16).verdict,
              Recovery::kResend);
  }
  {
    Pd pd;
    const RecoveryDecision d = pd.policy.Recover(Lost(pd, 100, 20, {1}), 40, 0, 20,
                                                 FrontendPolicy::kMaxWorkersLost + 1, 16);
    EXPECT_EQ(d.verdict, Recovery::kEndError);
    EXPECT_NE(d.message.find("lost 3 times"), std::string::npos) << d.message;
    EXPECT_EQ(pd.router->load(0).outstanding_requests, 0);
  }
  {
    // The continuation's prompt (the old prompt and what the client got) no longer fits a
    // prefill instance: it ends, rather than reaching a worker that cannot hold it.
    Pd pd;
    const RecoveryDecision d =
        pd.policy.Recover(Lost(pd, 600, 100, std::vector<std::int32_t>(50, 1)), 40, 0, 100, 1, 16);
    EXPECT_EQ(d.verdict, Recovery::kEndError);
    EXPECT_EQ(d.message,
              "its worker was lost and it cannot be retried: exceeds KV capacity: needs 700 KV "
              "tokens; an instance admits at most 640");
    EXPECT_EQ(pd.router->load(1).outstanding_requests, 0);
  }
}

}  // namespace
}  // namespace duet::policies
