// Helpers for reading JSON input files with errors that name the file and the field.
// Used by every JSON parser (models, clusters, synthetic trace specs) so messages look alike.
#pragma once

#include <nlohmann/json.hpp>
#include <string>

#include "common/status.h"

namespace duet {

// Reads and parses a JSON file; the error names the path and the parse position.
Result<nlohmann::json> ReadJsonFile(const std::string& path);

// Typed field access. `where` names the file (and object) for the message, e.g.
// "sim/clusters/x.json: nodes[0]". Missing or mistyped fields give an error naming the field.
Result<double> JsonNumber(const nlohmann::json& obj, const std::string& key,
                          const std::string& where);
Result<double> JsonNumberOr(const nlohmann::json& obj, const std::string& key, double fallback,
                            const std::string& where);
Result<std::int64_t> JsonInt(const nlohmann::json& obj, const std::string& key,
                             const std::string& where);
Result<std::int64_t> JsonIntOr(const nlohmann::json& obj, const std::string& key,
                               std::int64_t fallback, const std::string& where);
Result<std::string> JsonString(const nlohmann::json& obj, const std::string& key,
                               const std::string& where);
Result<std::string> JsonStringOr(const nlohmann::json& obj, const std::string& key,
                                 const std::string& fallback, const std::string& where);
Result<bool> JsonBoolOr(const nlohmann::json& obj, const std::string& key, bool fallback,
                        const std::string& where);

}  // namespace duet
