// SPDX-License-Identifier: Apache-2.0
// The "nvtaskset-topology/1" JSON schema: round trips, the golden files in
// tests/data/topology/, and strict rejection of every malformed field.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <stdexcept>

#include <sys/stat.h>
#include <unistd.h>

#include "nvtaskset/topology_json.hpp"
#include "test_topology_fixtures.hpp"

namespace nvtaskset::topo {
namespace {

using namespace testing;
using nlohmann::json;
namespace fs = std::filesystem;

const std::string kData = std::string(NVTASKSET_TEST_DATA_DIR) + "/topology";

void expect_same(const Topology& a, const Topology& b) {
  EXPECT_EQ(a.device.name, b.device.name);
  EXPECT_EQ(a.device.uuid, b.device.uuid);
  EXPECT_EQ(a.device.pci_bus_id, b.device.pci_bus_id);
  EXPECT_EQ(a.device.cc_major, b.device.cc_major);
  EXPECT_EQ(a.device.cc_minor, b.device.cc_minor);
  EXPECT_EQ(a.device.sm_count, b.device.sm_count);
  EXPECT_EQ(a.device.driver_version, b.device.driver_version);
  EXPECT_EQ(a.device.driver_release, b.device.driver_release);
  EXPECT_EQ(a.source, b.source);
  EXPECT_EQ(a.calibrated_at, b.calibrated_at);
  EXPECT_EQ(a.calibration_ms, b.calibration_ms);
  EXPECT_EQ(a.gpc_note, b.gpc_note);
  EXPECT_EQ(a.warnings, b.warnings);
  ASSERT_EQ(a.tpcs.size(), b.tpcs.size());
  for (std::size_t i = 0; i < a.tpcs.size(); ++i) {
    EXPECT_EQ(a.tpcs[i].id, b.tpcs[i].id) << i;
    EXPECT_EQ(a.tpcs[i].bit, b.tpcs[i].bit) << i;
    EXPECT_EQ(a.tpcs[i].gpc, b.tpcs[i].gpc) << i;
    EXPECT_EQ(a.tpcs[i].cluster_capable, b.tpcs[i].cluster_capable) << i;
  }
  ASSERT_EQ(a.gpcs.size(), b.gpcs.size());
  for (std::size_t g = 0; g < a.gpcs.size(); ++g) {
    EXPECT_EQ(a.gpcs[g].id, b.gpcs[g].id);
    EXPECT_EQ(a.gpcs[g].tpcs, b.gpcs[g].tpcs);
    EXPECT_EQ(a.gpcs[g].max_cluster, b.gpcs[g].max_cluster);
  }
}

Topology calibrated_h200() {
  Topology t = h200_topology();
  t.calibrated_at = "2025-06-01T12:00:00Z";
  t.calibration_ms = 812.5;
  t.gpc_note = "TPCs 40,49 never hosted a thread-block-cluster block, so their GPC is unknown";
  t.warnings = {"a warning"};
  return t;
}

std::string error_loading(const json& j) {
  try {
    topologies_from_json(j);
  } catch (const std::runtime_error& e) {
    return e.what();
  }
  return "";
}

TEST(TopologyJson, RoundTripsHopperLayout) {
  const Topology t = calibrated_h200();
  const json j = topology_to_json(t);
  EXPECT_EQ(j.at("schema"), "nvtaskset-topology/1");
  EXPECT_EQ(j.at("tpcs").size(), 66u);
  expect_same(topology_from_json(j), t);
  // Through text, and through nlohmann's ADL hooks.
  expect_same(topology_from_json(json::parse(j.dump())), t);
  expect_same(json::parse(j.dump()).get<Topology>(), t);
  json k = t;
  EXPECT_EQ(k, j);
}

TEST(TopologyJson, RoundTripsUnknownsAsNull) {
  Topology t = *identity_topology(a100_device());
  t.tpcs[3].bit.reset();
  const json j = topology_to_json(t);
  EXPECT_TRUE(j.at("tpcs")[3].at("bit").is_null());
  EXPECT_TRUE(j.at("tpcs")[0].at("gpc").is_null());
  EXPECT_TRUE(j.at("calibrated_at").is_null());
  EXPECT_TRUE(j.at("calibration_ms").is_null());
  EXPECT_EQ(j.at("gpcs"), json::array());
  expect_same(topology_from_json(j), t);
}

TEST(TopologyJson, DevicesArrayRoundTripsWithIndex) {
  const std::vector<Topology> ts = {h200_topology(0), h200_topology(1)};
  const json j = topologies_to_json(ts, /*with_index=*/true);
  EXPECT_EQ(j.at("devices")[1].at("device").at("index"), 1);
  const auto back = topologies_from_json(j);
  ASSERT_EQ(back.size(), 2u);
  expect_same(back[1], ts[1]);
  EXPECT_EQ(back[1].device.ordinal, 1u);
  // render_topology_json is the same document, as text.
  EXPECT_EQ(json::parse(render_topology_json(ts)), j);
}

TEST(TopologyJson, TpcEntriesMayComeInAnyOrder) {
  json j = topology_to_json(h200_topology());
  std::reverse(j["tpcs"].begin(), j["tpcs"].end());
  expect_same(topology_from_json(j), h200_topology());
}

TEST(TopologyJson, GoldenFilesStayReadable) {
  // Written by an earlier build; a schema change that breaks them must bump
  // the schema version.
  auto h200 = load_topology_file(kData + "/h200.json");
  ASSERT_EQ(h200.size(), 1u);
  Topology want = h200_topology();
  want.calibrated_at = "2025-06-01T12:00:00Z";
  want.calibration_ms = 1234.5;
  std::vector<unsigned> unplaced;
  for (const auto& ti : want.tpcs)
    if (!ti.gpc) unplaced.push_back(ti.id.value);
  want.gpc_note = "TPCs " + format_ranges(unplaced) + " never hosted a thread-block-cluster block, so their GPC is unknown";
  expect_same(h200[0], want);

  auto two = load_topology_file(kData + "/two_gpus.json");
  ASSERT_EQ(two.size(), 2u);
  EXPECT_EQ(two[0].device.uuid, h200_device(0).uuid);
  EXPECT_EQ(two[1].device.uuid, h200_device(1).uuid);

  auto a100 = load_topology_file(kData + "/a100.json");
  ASSERT_EQ(a100.size(), 1u);
  expect_same(a100[0], *identity_topology(a100_device()));
}

TEST(TopologyJson, FileErrorsNameTheFile) {
  auto err = [](const std::string& path) {
    try {
      load_topology_file(path);
    } catch (const std::runtime_error& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  EXPECT_NE(err(kData + "/missing.json").find("topology file " + kData + "/missing.json: cannot open"),
            std::string::npos);
  EXPECT_NE(err(kData + "/not_json.json").find("not valid JSON"), std::string::npos);
  const std::string e = err(kData + "/wrong_schema.json");
  EXPECT_NE(e.find("wrong_schema.json: schema: \"nvtaskset-topology/99\" is not supported"), std::string::npos) << e;
  const std::string d = err(kData + "/duplicate_bit.json");
  EXPECT_NE(d.find("duplicate_bit.json: tpcs[1].bit: bit 5 already controls TPC 0"), std::string::npos) << d;
}

std::string error_of_text(const std::string& text) {
  try {
    topologies_from_text(text);
  } catch (const std::runtime_error& e) {
    return e.what();
  }
  return "(accepted)";
}

TEST(TopologyJson, DuplicateKeysAreRejectedNamingTheKey) {
  // With the last value winning, this file would load as a valid layout
  // (bits 5 and 6): the first "bit" the author wrote would be ignored.
  try {
    load_topology_file(kData + "/duplicate_key.json");
    FAIL() << "accepted a file with a duplicate key";
  } catch (const std::runtime_error& e) {
    EXPECT_EQ(std::string(e.what()), "topology file " + kData +
                                         "/duplicate_key.json: tpcs[1].bit: duplicate key (JSON would silently keep "
                                         "the last value; give each key once)");
  }
  const std::string good = topology_to_json(h200_topology()).dump();
  ASSERT_EQ(error_of_text(good), "(accepted)");
  // At the top, in a nested object, in an array of objects, inside "devices".
  auto dup = [&](const std::string& key_with_value, const std::string& where_after) {
    std::string t = good;
    const auto at = t.find(where_after);
    EXPECT_NE(at, std::string::npos) << where_after;
    return t.insert(at + where_after.size(), key_with_value + ",");
  };
  EXPECT_NE(error_of_text(dup("\"source\":\"calibration\"", "{")).find("source: duplicate key"), std::string::npos);
  EXPECT_NE(error_of_text(dup("\"sm_count\":132", "\"device\":{")).find("device.sm_count: duplicate key"),
            std::string::npos);
  {
    std::string t = good;
    // The sixth TPC entry gets a second "tpc".
    std::size_t at = 0;
    for (int i = 0; i < 6; ++i) at = t.find("{\"bit\"", at + 1);
    t.insert(at + 1, "\"tpc\":5,");
    EXPECT_NE(error_of_text(t).find("tpcs[5].tpc: duplicate key"), std::string::npos) << error_of_text(t);
  }
  const std::string two = topologies_to_json({h200_topology(0), h200_topology(1)}).dump();
  std::string t = two;
  t.insert(t.rfind("\"device\":{") + 10, "\"name\":\"x\",");
  EXPECT_NE(error_of_text(t).find("devices[1].device.name: duplicate key"), std::string::npos) << error_of_text(t);
  t = two;
  t.insert(1, "\"devices\":[],");
  EXPECT_NE(error_of_text(t).find("devices: duplicate key"), std::string::npos) << error_of_text(t);
  // The same key in sibling objects is what every file has, and fine.
  EXPECT_EQ(error_of_text(two).substr(0, 10), "(accepted)");
}

TEST(TopologyJson, ErrorsFromTextAreOneLine) {
  json j = topology_to_json(h200_topology());
  j["device"]["uuid"] = "GPU-\nsecond line";
  const std::string e = error_of_text(j.dump());
  EXPECT_EQ(e, "device.uuid: \"GPU-\\x0asecond line\" is not a GPU UUID "
               "(GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx)");
  EXPECT_EQ(error_of_text("{\"schema\": "), "not valid JSON (at byte 12)");
  EXPECT_EQ(error_of_text(""), "not valid JSON (at byte 1)");
}

TEST(TopologyJson, SaveWritesReadableFileAtomically) {
  const std::string dir = ::testing::TempDir() + "nvtaskset_json_save";
  fs::create_directories(dir);
  const std::string path = dir + "/t.json";
  save_topology_file(path, {calibrated_h200()});
  auto back = load_topology_file(path);
  ASSERT_EQ(back.size(), 1u);
  expect_same(back[0], calibrated_h200());
  struct stat st {};
  ASSERT_EQ(::stat(path.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0644u);
  // No temporary file left behind.
  EXPECT_EQ(std::distance(fs::directory_iterator(dir), fs::directory_iterator()), 1);
  save_topology_file(path, {h200_topology(0), h200_topology(1)});
  EXPECT_EQ(load_topology_file(path).size(), 2u);
  fs::remove_all(dir);
}

// Each malformed document, and the one-line error that must name its field.
struct Malformed {
  const char* what;
  std::function<void(json&)> mutate;
  const char* error;  // expected substring
};

class TopologyJsonMalformed : public ::testing::TestWithParam<Malformed> {};

TEST_P(TopologyJsonMalformed, IsRejectedNamingTheField) {
  json j = topology_to_json(h200_topology());
  GetParam().mutate(j);
  const std::string e = error_loading(j);
  EXPECT_NE(e.find(GetParam().error), std::string::npos) << "got: '" << e << "'";
  EXPECT_EQ(e.find('\n'), std::string::npos) << "one line";
}

const Malformed kMalformed[] = {
    {"no schema", [](json& j) { j.erase("schema"); }, "schema: missing"},
    {"future schema", [](json& j) { j["schema"] = "nvtaskset-topology/2"; }, "schema: \"nvtaskset-topology/2\" is not supported"},
    {"schema not a string", [](json& j) { j["schema"] = 1; }, "schema: expected a string, got an integer"},
    {"no device", [](json& j) { j.erase("device"); }, "device: missing"},
    {"device not an object", [](json& j) { j["device"] = json::array(); }, "device: expected an object, got an array"},
    {"bad uuid", [](json& j) { j["device"]["uuid"] = "GPU-123"; }, "device.uuid: \"GPU-123\" is not a GPU UUID"},
    {"uuid not a string", [](json& j) { j["device"]["uuid"] = 5; }, "device.uuid: expected a string, got an integer"},
    {"sm_count a string", [](json& j) { j["device"]["sm_count"] = "132"; }, "device.sm_count: expected an integer 0-256, got a string"},
    {"sm_count odd", [](json& j) { j["device"]["sm_count"] = 131; }, "device.sm_count: 131 is not a positive even number"},
    {"sm_count zero", [](json& j) { j["device"]["sm_count"] = 0; }, "device.sm_count: 0 is not a positive even number"},
    {"sm_count too big", [](json& j) { j["device"]["sm_count"] = 258; }, "device.sm_count: 258 is out of range 0-256"},
    {"tpc count != sm_count/2", [](json& j) { j["device"]["sm_count"] = 130; }, "tpcs: 66 entries, but sm_count 130 means 65 TPCs"},
    {"cc a number", [](json& j) { j["device"]["compute_capability"] = 9.0; }, "device.compute_capability: expected a string, got a number with a fraction"},
    {"cc malformed", [](json& j) { j["device"]["compute_capability"] = "nine"; }, "device.compute_capability: \"nine\" is not of the form \"9.0\""},
    {"cc three digits", [](json& j) { j["device"]["compute_capability"] = "9.100"; }, "device.compute_capability: \"9.100\" is not of the form \"9.0\""},
    {"cc no minor", [](json& j) { j["device"]["compute_capability"] = "9."; }, "device.compute_capability: \"9.\" is not of the form \"9.0\""},
    {"cc no major", [](json& j) { j["device"]["compute_capability"] = ".0"; }, "device.compute_capability: \".0\" is not of the form \"9.0\""},
    {"cc two dots", [](json& j) { j["device"]["compute_capability"] = "9.0.1"; }, "device.compute_capability: \"9.0.1\" is not of the form \"9.0\""},
    {"cc signed", [](json& j) { j["device"]["compute_capability"] = "+9.0"; }, "device.compute_capability: \"+9.0\" is not of the form \"9.0\""},
    {"driver_version negative", [](json& j) { j["device"]["driver_version"] = -1; }, "device.driver_version: -1 is out of range"},
    {"no source", [](json& j) { j.erase("source"); }, "source: missing"},
    {"calibration_ms a string", [](json& j) { j["calibration_ms"] = "fast"; }, "calibration_ms: expected a non-negative number or null"},
    {"tpcs not an array", [](json& j) { j["tpcs"] = json::object(); }, "tpcs: expected an array, got an object"},
    {"tpc entry not an object", [](json& j) { j["tpcs"][3] = 3; }, "tpcs[3]: expected an object, got an integer"},
    {"bit a string", [](json& j) { j["tpcs"][3]["bit"] = "17"; }, "tpcs[3].bit: expected an integer 0-127 or null, got a string"},
    {"bit fractional", [](json& j) { j["tpcs"][3]["bit"] = 1.5; }, "tpcs[3].bit: expected an integer 0-127 or null, got a number with a fraction"},
    {"bit 128", [](json& j) { j["tpcs"][3]["bit"] = 128; }, "tpcs[3].bit: 128 is out of range 0-127"},
    {"bit negative", [](json& j) { j["tpcs"][3]["bit"] = -1; }, "tpcs[3].bit: -1 is out of range 0-127"},
    {"duplicate bit", [](json& j) { j["tpcs"][3]["bit"] = j["tpcs"][2]["bit"]; }, "tpcs[3].bit: bit "},
    {"bit missing", [](json& j) { j["tpcs"][3].erase("bit"); }, "tpcs[3].bit: missing"},
    {"tpc id repeated", [](json& j) { j["tpcs"][3]["tpc"] = 2; }, "tpcs[3].tpc: TPC 2 is listed twice"},
    {"tpc id too big", [](json& j) { j["tpcs"][3]["tpc"] = 66; }, "tpcs[3].tpc: 66 is out of range 0-65"},
    {"gpc a string", [](json& j) { j["tpcs"][3]["gpc"] = "3"; }, "tpcs[3].gpc: expected an integer or null, got a string"},
    {"gpc missing", [](json& j) { j["tpcs"][3].erase("gpc"); }, "tpcs[3].gpc: missing"},
    {"gpc not listed", [](json& j) { j["tpcs"][0]["gpc"] = 1; }, "tpcs[0].gpc: TPC 0 says GPC 1 but gpcs[1].tpcs does not list it"},
    {"gpc beyond gpcs", [](json& j) { j["tpcs"][0]["gpc"] = 8; }, "tpcs[0].gpc: GPC 8 is not in gpcs (GPCs 0-7)"},
    {"cluster_capable a string", [](json& j) { j["tpcs"][3]["cluster_capable"] = "yes"; }, "tpcs[3].cluster_capable: expected true or false, got a string"},
    {"gpcs not an array", [](json& j) { j["gpcs"] = 8; }, "gpcs: expected an array, got an integer"},
    {"gpc id out of range", [](json& j) { j["gpcs"][0]["gpc"] = 9; }, "gpcs[0].gpc: GPC 9 out of range: 8 GPCs must be numbered 0-7"},
    {"gpc id repeated", [](json& j) { j["gpcs"][1]["gpc"] = 0; }, "gpcs[1].gpc: GPC 0 is listed twice"},
    {"gpc tpcs not an array", [](json& j) { j["gpcs"][0]["tpcs"] = 0; }, "gpcs[0].tpcs: expected an array, got an integer"},
    {"gpc lists a TPC of another GPC", [](json& j) { j["gpcs"][0]["tpcs"].push_back(1); }, "gpcs[0].tpcs"},
    {"gpc lists a TPC that does not exist", [](json& j) { j["gpcs"][0]["tpcs"][0] = 66; }, "gpcs[0].tpcs[0]: 66 is out of range 0-65"},
    {"max_cluster a string", [](json& j) { j["gpcs"][0]["max_cluster"] = "16"; }, "gpcs[0].max_cluster: expected an integer 0-64, got a string"},
    {"warnings not strings", [](json& j) { j["warnings"] = json::array({1}); }, "warnings[0]: expected a string, got an integer"},
    {"empty devices", [](json& j) { j = json{{"schema", kTopologySchema}, {"devices", json::array()}}; }, "devices: empty"},
    {"devices without schema", [](json& j) { j = json{{"devices", json::array({j})}}; }, "schema: missing"},
    {"device entry with a bad bit", [](json& j) { j["tpcs"][4]["bit"] = 300; j = json{{"schema", kTopologySchema}, {"devices", json::array({j})}}; }, "devices[0].tpcs[4].bit: 300 is out of range 0-127"},
    {"same GPU twice", [](json& j) { j = json{{"schema", kTopologySchema}, {"devices", json::array({j, j})}}; }, "devices[1]: GPU-"},
    {"top level array", [](json& j) { j = json::array({j}); }, "expected a JSON object, got an array"},
};

INSTANTIATE_TEST_SUITE_P(AllFields, TopologyJsonMalformed, ::testing::ValuesIn(kMalformed),
                         [](const ::testing::TestParamInfo<Malformed>& info) {
                           std::string n = info.param.what;
                           for (char& c : n)
                             if (!std::isalnum(static_cast<unsigned char>(c))) c = '_';
                           return n;
                         });

TEST(TopologyJson, PreHopperBitsStopAt63) {
  json j = topology_to_json(*identity_topology(a100_device()));
  j["tpcs"][5]["bit"] = 64;
  EXPECT_NE(error_loading(j).find("tpcs[5].bit: 64 is out of range 0-63"), std::string::npos) << error_loading(j);
}

}  // namespace
}  // namespace nvtaskset::topo
