// The worker link's secret and proofs (see link_auth.h).
#include "backend/cluster/link_auth.h"

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <sys/random.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>

namespace duet::backend::cluster {

Result<std::string> RandomBytes(std::size_t bytes) {
  std::string out(bytes, '\0');
  std::size_t got = 0;
  while (got < bytes) {
    const ssize_t n = ::getrandom(out.data() + got, bytes - got, 0);
    if (n < 0) {
      if (errno == EINTR) continue;
      return Status::Error(std::string("getrandom: ") + std::strerror(errno));
    }
    got += static_cast<std::size_t>(n);
  }
  return out;
}

Result<std::string> GenerateWorkerSecret() {
  auto bytes = RandomBytes(32);
  if (!bytes.ok()) return bytes.status();
  static constexpr char kHex[] = "0123456789abcdef";
  std::string hex;
  for (const char c : *bytes) {
    hex.push_back(kHex[static_cast<unsigned char>(c) >> 4]);
    hex.push_back(kHex[static_cast<unsigned char>(c) & 0xf]);
  }
  return hex;
}

Result<std::string> LoadWorkerSecret(const std::string& file) {
  std::string secret;
  std::string from;
  if (!file.empty()) {
    std::ifstream in(file, std::ios::binary);
    if (!in) return Status::Error(file + ": " + std::strerror(errno));
    std::ostringstream all;
    all << in.rdbuf();
    secret = all.str();
    // An editor's or echo's newline is not part of the secret.
    while (!secret.empty() && std::isspace(static_cast<unsigned char>(secret.back())))
      secret.pop_back();
    from = file;
  } else if (const char* env = std::getenv(kWorkerSecretEnv); env && *env) {
    secret = env;
    from = std::string("$") + kWorkerSecretEnv;
  } else {
    return std::string();
  }
  if (secret.size() < kMinSecretBytes) {
    return Status::Error(from + ": a worker secret of " + std::to_string(secret.size()) +
                         " bytes; at least " + std::to_string(kMinSecretBytes) +
                         " are needed (e.g. head -c 32 /dev/urandom | base64 > FILE)");
  }
  return secret;
}

std::string LinkProof(std::string_view secret, ProofSide side, std::string_view hello_body,
                      std::string_view frontend_nonce) {
  // The label ends in a NUL, so no label is a prefix of another's input.
  const std::string_view label = side == ProofSide::kFrontend
                                     ? std::string_view("duet worker link v2: frontend\0", 30)
                                     : std::string_view("duet worker link v2: worker\0", 28);
  std::string message;
  message.reserve(label.size() + hello_body.size() + frontend_nonce.size());
  message.append(label).append(hello_body).append(frontend_nonce);
  unsigned char mac[EVP_MAX_MD_SIZE];
  unsigned int mac_bytes = 0;
  const unsigned char* done =
      HMAC(EVP_sha256(), secret.data(), static_cast<int>(secret.size()),
           reinterpret_cast<const unsigned char*>(message.data()), message.size(), mac, &mac_bytes);
  DUET_CHECK(done != nullptr && mac_bytes == 32);
  return std::string(reinterpret_cast<const char*>(mac), mac_bytes);
}

bool ConstantTimeEquals(std::string_view expected, std::string_view got) {
  return expected.size() == got.size() &&
         CRYPTO_memcmp(expected.data(), got.data(), expected.size()) == 0;
}

}  // namespace duet::backend::cluster
