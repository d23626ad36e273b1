// The worker link's authentication: the secret a frontend and its workers share, and the
// proofs each side makes with it at hello (HMAC-SHA256, OpenSSL's libcrypto), so that neither
// sends the secret itself and a recorded proof is worth nothing on another connection (each
// covers both sides' fresh nonces). docs/serving.md says what it protects against.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

#include "common/status.h"

namespace duet::backend::cluster {

// Where `duet serve` hands the secret to the workers it starts (never their command line,
// which any local user can read in ps), and where both commands look for it otherwise.
inline constexpr const char* kWorkerSecretEnv = "DUET_WORKER_SECRET";
inline constexpr std::size_t kMinSecretBytes = 16;

// `bytes` bytes from the kernel's CSPRNG (getrandom).
Result<std::string> RandomBytes(std::size_t bytes);
// A fresh secret: 32 random bytes as 64 hex digits.
Result<std::string> GenerateWorkerSecret();
// The secret in `file` (its trailing whitespace dropped) when `file` is not empty, else in
// $DUET_WORKER_SECRET; empty when neither gives one. An error when the file cannot be read or
// the secret is shorter than kMinSecretBytes.
Result<std::string> LoadWorkerSecret(const std::string& file);

enum class ProofSide { kFrontend, kWorker };
// One side's proof: HMAC-SHA256 under `secret` of the side's label, the worker's hello body
// (its nonce included) and the frontend's nonce. The labels keep one side's proof from
// passing as the other's.
std::string LinkProof(std::string_view secret, ProofSide side, std::string_view hello_body,
                      std::string_view frontend_nonce);
// `got` equals `expected`, compared in a time that does not depend on where they differ
// (CRYPTO_memcmp; only their lengths may show): proofs, and duet serve's API key.
bool ConstantTimeEquals(std::string_view expected, std::string_view got);

}  // namespace duet::backend::cluster
