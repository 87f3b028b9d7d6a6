// SPDX-License-Identifier: Apache-2.0
// The topology JSON schema "nvtaskset-topology/1" (docs/topology.md): the
// format of the cache, of --topology-file / $NVTASKSET_TOPOLOGY, and of
// `nvtaskset --topology --json`.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "nvtaskset/topology.hpp"

namespace nvtaskset::topo {

inline constexpr const char* kTopologySchema = "nvtaskset-topology/1";

// One topology as a JSON object (with "schema"). `with_index` adds the
// process-local device ordinal as device.index (ignored when loading).
nlohmann::json topology_to_json(const Topology& t, bool with_index = false);

// Strict: wrong types, missing fields, duplicate bits, a TPC count other than
// sm_count/2, bits >= 128, inconsistent GPC lists... throw std::runtime_error
// with one line naming the field ("tpcs[3].bit: bit 17 already controls TPC 1").
// `path` prefixes field names (e.g. "devices[1]").
Topology topology_from_json(const nlohmann::json& j, const std::string& path = "");

// A document holding one topology object or {"schema": ..., "devices": [...]}.
std::vector<Topology> topologies_from_json(const nlohmann::json& j);

// {"schema": ..., "devices": [...]}.
nlohmann::json topologies_to_json(const std::vector<Topology>& topos, bool with_index = false);

// Parses and validates a document's text (what load_topology_file reads).
// Stricter than JSON: a key repeated in one object is an error, since
// nlohmann (like most parsers) would silently keep the last value. Errors are
// one line (control characters from the text are escaped).
std::vector<Topology> topologies_from_text(std::string_view text);

// Reads and validates a file; errors read "topology file F: <reason>".
std::vector<Topology> load_topology_file(const std::string& path);
// Writes atomically (temporary file + rename). Throws std::runtime_error.
void save_topology_file(const std::string& path, const std::vector<Topology>& topos);

// nlohmann ADL hooks (from_json is the strict loader above).
void to_json(nlohmann::json& j, const Topology& t);
void from_json(const nlohmann::json& j, Topology& t);

}  // namespace nvtaskset::topo
