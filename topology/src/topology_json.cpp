// SPDX-License-Identifier: Apache-2.0
// The "nvtaskset-topology/1" JSON schema (docs/topology.md). Loading is
// strict: a topology decides which TPCs a task may run on, and a wrong bit
// can make kernels never run, so every field is checked and every error
// names the field.
#include "nvtaskset/topology_json.hpp"

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <set>
#include <sstream>
#include <stdexcept>
#include <string_view>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <fmt/format.h>

namespace nvtaskset::topo {

using nlohmann::json;

namespace {

[[noreturn]] void fail(const std::string& path, const std::string& msg) {
  throw std::runtime_error(path.empty() ? msg : path + ": " + msg);
}

std::string join(const std::string& path, const std::string& key) { return path.empty() ? key : path + "." + key; }
std::string index(const std::string& path, std::size_t i) { return fmt::format("{}[{}]", path, i); }

std::string type_of(const json& v) {
  if (v.is_null()) return "null";
  if (v.is_boolean()) return "a boolean";
  if (v.is_number_integer()) return "an integer";
  if (v.is_number_float()) return "a number with a fraction";
  if (v.is_string()) return "a string";
  if (v.is_array()) return "an array";
  if (v.is_object()) return "an object";
  return "something else";
}

const json& field(const json& obj, const char* key, const std::string& path) {
  auto it = obj.find(key);
  if (it == obj.end()) fail(join(path, key), "missing");
  return *it;
}

const json* optional_field(const json& obj, const char* key) {
  auto it = obj.find(key);
  return it == obj.end() ? nullptr : &*it;
}

std::uint64_t get_uint(const json& v, const std::string& path, std::uint64_t max) {
  if (!v.is_number_integer()) fail(path, fmt::format("expected an integer 0-{}, got {}", max, type_of(v)));
  if (v.is_number_unsigned()) {
    auto x = v.get<std::uint64_t>();
    if (x > max) fail(path, fmt::format("{} is out of range 0-{}", x, max));
    return x;
  }
  auto x = v.get<std::int64_t>();
  if (x < 0 || static_cast<std::uint64_t>(x) > max) fail(path, fmt::format("{} is out of range 0-{}", x, max));
  return static_cast<std::uint64_t>(x);
}

int get_int(const json& v, const std::string& path) {
  if (!v.is_number_integer()) fail(path, fmt::format("expected an integer, got {}", type_of(v)));
  auto x = v.get<std::int64_t>();
  if (x < 0 || x > 1000000000) fail(path, fmt::format("{} is out of range", x));
  return static_cast<int>(x);
}

std::string get_string(const json& v, const std::string& path) {
  if (!v.is_string()) fail(path, fmt::format("expected a string, got {}", type_of(v)));
  return v.get<std::string>();
}

bool get_bool(const json& v, const std::string& path) {
  if (!v.is_boolean()) fail(path, fmt::format("expected true or false, got {}", type_of(v)));
  return v.get<bool>();
}

const json& get_array(const json& v, const std::string& path) {
  if (!v.is_array()) fail(path, fmt::format("expected an array, got {}", type_of(v)));
  return v;
}

const json& get_object(const json& v, const std::string& path) {
  if (!v.is_object()) fail(path, fmt::format("expected an object, got {}", type_of(v)));
  return v;
}

void check_schema(const json& obj, const std::string& path, bool required) {
  const json* s = optional_field(obj, "schema");
  if (!s) {
    if (required) fail(join(path, "schema"), fmt::format("missing (expected \"{}\")", kTopologySchema));
    return;
  }
  const std::string v = get_string(*s, join(path, "schema"));
  if (v != kTopologySchema)
    fail(join(path, "schema"), fmt::format("\"{}\" is not supported (expected \"{}\")", v, kTopologySchema));
}

DeviceInfo device_from_json(const json& j, const std::string& path) {
  get_object(j, path);
  DeviceInfo d;
  d.name = get_string(field(j, "name", path), join(path, "name"));
  const std::string uuid = get_string(field(j, "uuid", path), join(path, "uuid"));
  auto u = uuid_from_string(uuid);
  if (!u) fail(join(path, "uuid"), fmt::format("\"{}\" is not a GPU UUID (GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx)", uuid));
  d.uuid = *u;
  if (const json* p = optional_field(j, "pci_bus_id")) d.pci_bus_id = get_string(*p, join(path, "pci_bus_id"));
  const std::string cc = get_string(field(j, "compute_capability", path), join(path, "compute_capability"));
  // "M.m", each 1-2 digits (by hand: a std::regex costs every launch that
  // reads a topology file a third of its instructions).
  const auto dot = cc.find('.');
  auto digits = [](std::string_view t) {
    return !t.empty() && t.size() <= 2 && t.find_first_not_of("0123456789") == std::string_view::npos;
  };
  if (dot == std::string::npos || !digits(std::string_view(cc).substr(0, dot)) ||
      !digits(std::string_view(cc).substr(dot + 1)))
    fail(join(path, "compute_capability"), fmt::format("\"{}\" is not of the form \"9.0\"", cc));
  d.cc_major = std::stoi(cc.substr(0, dot));
  d.cc_minor = std::stoi(cc.substr(dot + 1));
  d.sm_count = static_cast<unsigned>(get_uint(field(j, "sm_count", path), join(path, "sm_count"), 2 * Bits128::kSize));
  if (d.sm_count == 0 || d.sm_count % 2)
    fail(join(path, "sm_count"), fmt::format("{} is not a positive even number (a TPC holds 2 SMs)", d.sm_count));
  d.driver_version = get_int(field(j, "driver_version", path), join(path, "driver_version"));
  if (const json* p = optional_field(j, "driver_release")) d.driver_release = get_string(*p, join(path, "driver_release"));
  if (const json* p = optional_field(j, "index"))
    d.ordinal = static_cast<unsigned>(get_uint(*p, join(path, "index"), 1u << 20));
  return d;
}

// Text form for files and `--topology --json`: keys in schema order, and
// objects or arrays that hold only scalars on one line (one line per TPC).
int key_rank(const std::string& k) {
  static const char* order[] = {"schema", "devices", "device", "index", "name", "uuid", "pci_bus_id",
                                "compute_capability", "sm_count", "driver_version", "driver_release", "source",
                                "calibrated_at", "calibration_ms", "gpc_note", "warnings", "tpcs", "gpcs", "tpc",
                                "bit", "gpc", "cluster_capable", "max_cluster"};
  for (int i = 0; i < static_cast<int>(std::size(order)); ++i)
    if (k == order[i]) return i;
  return static_cast<int>(std::size(order));
}

void pretty(const json& j, int indent, std::string& out) {
  if (!j.is_structured()) {
    out += j.dump();
    return;
  }
  std::vector<std::pair<std::string, const json*>> items;
  if (j.is_object()) {
    for (auto it = j.begin(); it != j.end(); ++it) items.emplace_back(it.key(), &it.value());
    std::stable_sort(items.begin(), items.end(),
                     [](const auto& a, const auto& b) { return key_rank(a.first) < key_rank(b.first); });
  } else {
    for (const auto& e : j) items.emplace_back("", &e);
  }
  const char open = j.is_object() ? '{' : '[', close = j.is_object() ? '}' : ']';
  const bool flat = std::none_of(items.begin(), items.end(), [](const auto& i) { return i.second->is_structured(); });
  out += open;
  for (std::size_t i = 0; i < items.size(); ++i) {
    if (flat) {
      out += i ? ", " : "";
    } else {
      out += i ? ",\n" : "\n";
      out.append(static_cast<std::size_t>(indent + 2), ' ');
    }
    if (j.is_object()) out += json(items[i].first).dump() + ": ";
    pretty(*items[i].second, indent + 2, out);
  }
  if (!flat && !items.empty()) {
    out += '\n';
    out.append(static_cast<std::size_t>(indent), ' ');
  }
  out += close;
}

std::string pretty(const json& j) {
  std::string out;
  pretty(j, 0, out);
  return out + "\n";
}

}  // namespace

json topology_to_json(const Topology& t, bool with_index) {
  const DeviceInfo& d = t.device;
  json dev = {
      {"name", d.name},
      {"uuid", uuid_to_string(d.uuid)},
      {"pci_bus_id", d.pci_bus_id},
      {"compute_capability", fmt::format("{}.{}", d.cc_major, d.cc_minor)},
      {"sm_count", d.sm_count},
      {"driver_version", d.driver_version},
      {"driver_release", d.driver_release},
  };
  if (with_index) dev["index"] = d.ordinal;
  json tpcs = json::array();
  for (const TpcInfo& ti : t.tpcs) {
    tpcs.push_back({{"tpc", ti.id.value},
                    {"bit", ti.bit ? json(ti.bit->value) : json(nullptr)},
                    {"gpc", ti.gpc ? json(ti.gpc->value) : json(nullptr)},
                    {"cluster_capable", ti.cluster_capable}});
  }
  json gpcs = json::array();
  for (const GpcInfo& g : t.gpcs) {
    json list = json::array();
    for (auto k : g.tpcs) list.push_back(k.value);
    gpcs.push_back({{"gpc", g.id.value}, {"tpcs", list}, {"max_cluster", g.max_cluster}});
  }
  json j = {
      {"schema", kTopologySchema},
      {"device", dev},
      {"source", t.source},
      {"calibrated_at", t.calibrated_at.empty() ? json(nullptr) : json(t.calibrated_at)},
      {"calibration_ms", t.calibration_ms ? json(*t.calibration_ms) : json(nullptr)},
      {"tpcs", tpcs},
      {"gpcs", gpcs},
  };
  if (!t.gpc_note.empty()) j["gpc_note"] = t.gpc_note;
  if (!t.warnings.empty()) j["warnings"] = t.warnings;
  return j;
}

Topology topology_from_json(const json& j, const std::string& path) {
  get_object(j, path.empty() ? "topology" : path);
  check_schema(j, path, /*required=*/path.empty());
  Topology t;
  t.device = device_from_json(field(j, "device", path), join(path, "device"));
  t.source = get_string(field(j, "source", path), join(path, "source"));
  if (const json* p = optional_field(j, "calibrated_at"); p && !p->is_null())
    t.calibrated_at = get_string(*p, join(path, "calibrated_at"));
  if (const json* p = optional_field(j, "calibration_ms"); p && !p->is_null()) {
    if (!p->is_number() || p->get<double>() < 0)
      fail(join(path, "calibration_ms"), fmt::format("expected a non-negative number or null, got {}", type_of(*p)));
    t.calibration_ms = p->get<double>();
  }
  if (const json* p = optional_field(j, "gpc_note")) t.gpc_note = get_string(*p, join(path, "gpc_note"));
  if (const json* p = optional_field(j, "warnings")) {
    const std::string wp = join(path, "warnings");
    get_array(*p, wp);
    for (std::size_t i = 0; i < p->size(); ++i) t.warnings.push_back(get_string((*p)[i], index(wp, i)));
  }

  const unsigned n = t.device.tpc_count();
  const std::string tp = join(path, "tpcs");
  const json& tpcs = get_array(field(j, "tpcs", path), tp);
  if (tpcs.size() != n)
    fail(tp, fmt::format("{} entries, but sm_count {} means {} TPCs", tpcs.size(), t.device.sm_count, n));
  // The pre-Hopper TMD mask has 64 bits, Hopper's and Blackwell's 128 (tmd.hpp).
  const unsigned bit_limit = t.device.mask_bits_are_logical() ? 64 : 128;
  t.tpcs.resize(n);
  std::vector<bool> seen(n, false);
  std::vector<int> bit_owner(128, -1);
  for (std::size_t i = 0; i < n; ++i) {
    const std::string ep = index(tp, i);
    const json& e = get_object(tpcs[i], ep);
    const unsigned id = static_cast<unsigned>(get_uint(field(e, "tpc", ep), join(ep, "tpc"), n - 1));
    if (seen[id]) fail(join(ep, "tpc"), fmt::format("TPC {} is listed twice", id));
    seen[id] = true;
    TpcInfo& ti = t.tpcs[id];
    ti.id = LogicalTpcId{id};
    const json& bit = field(e, "bit", ep);
    if (!bit.is_null()) {
      if (!bit.is_number_integer())
        fail(join(ep, "bit"), fmt::format("expected an integer 0-{} or null, got {}", bit_limit - 1, type_of(bit)));
      const unsigned b = static_cast<unsigned>(get_uint(bit, join(ep, "bit"), bit_limit - 1));
      if (bit_owner[b] >= 0) fail(join(ep, "bit"), fmt::format("bit {} already controls TPC {}", b, bit_owner[b]));
      bit_owner[b] = static_cast<int>(id);
      ti.bit = PhysicalTpcBit{b};
    }
    const json& gpc = field(e, "gpc", ep);
    if (!gpc.is_null()) {
      if (!gpc.is_number_integer())
        fail(join(ep, "gpc"), fmt::format("expected an integer or null, got {}", type_of(gpc)));
      ti.gpc = GpcId{static_cast<unsigned>(get_uint(gpc, join(ep, "gpc"), 127))};
    }
    ti.cluster_capable = get_bool(field(e, "cluster_capable", ep), join(ep, "cluster_capable"));
  }

  const std::string gp = join(path, "gpcs");
  const json& gpcs = get_array(field(j, "gpcs", path), gp);
  t.gpcs.resize(gpcs.size());
  std::vector<bool> gseen(gpcs.size(), false);
  for (std::size_t i = 0; i < gpcs.size(); ++i) {
    const std::string ep = index(gp, i);
    const json& e = get_object(gpcs[i], ep);
    const json& idj = field(e, "gpc", ep);
    if (!idj.is_number_integer()) fail(join(ep, "gpc"), fmt::format("expected an integer, got {}", type_of(idj)));
    const std::uint64_t id = get_uint(idj, join(ep, "gpc"), 1u << 20);
    if (id >= gpcs.size())
      fail(join(ep, "gpc"), fmt::format("GPC {} out of range: {} GPCs must be numbered 0-{}", id, gpcs.size(),
                                        gpcs.size() - 1));
    if (gseen[id]) fail(join(ep, "gpc"), fmt::format("GPC {} is listed twice", id));
    gseen[id] = true;
    GpcInfo& g = t.gpcs[id];
    g.id = GpcId{static_cast<unsigned>(id)};
    const std::string lp = join(ep, "tpcs");
    const json& list = get_array(field(e, "tpcs", ep), lp);
    for (std::size_t k = 0; k < list.size(); ++k)
      g.tpcs.push_back(LogicalTpcId{static_cast<unsigned>(get_uint(list[k], index(lp, k), n - 1))});
    g.max_cluster = static_cast<unsigned>(get_uint(field(e, "max_cluster", ep), join(ep, "max_cluster"), 64));
  }

  // Cross-field invariants (unique bits, GPC lists agree with per-TPC GPCs).
  try {
    validate(t);
  } catch (const std::runtime_error& e) {
    fail(path, e.what());
  }
  return t;
}

std::vector<Topology> topologies_from_json(const json& j) {
  if (!j.is_object()) fail("", fmt::format("expected a JSON object, got {}", type_of(j)));
  std::vector<Topology> out;
  if (const json* devs = optional_field(j, "devices")) {
    check_schema(j, "", /*required=*/true);
    get_array(*devs, "devices");
    if (devs->empty()) fail("devices", "empty: no GPU described");
    for (std::size_t i = 0; i < devs->size(); ++i) out.push_back(topology_from_json((*devs)[i], index("devices", i)));
    for (std::size_t i = 0; i < out.size(); ++i)
      for (std::size_t k = 0; k < i; ++k)
        if (out[i].device.uuid == out[k].device.uuid)
          fail(index("devices", i), fmt::format("{} is described twice (also devices[{}])",
                                                uuid_to_string(out[i].device.uuid), k));
  } else {
    out.push_back(topology_from_json(j));
  }
  return out;
}

json topologies_to_json(const std::vector<Topology>& topos, bool with_index) {
  json devs = json::array();
  for (const auto& t : topos) devs.push_back(topology_to_json(t, with_index));
  return json{{"schema", kTopologySchema}, {"devices", devs}};
}

namespace {

// A SAX pass that only looks for a key repeated within one object, and
// remembers where ("devices[0].tpcs[3].bit"), in the field naming of the
// loader's other messages. The DOM parser cannot report this: by the time it
// returns, the first value is gone.
class DuplicateKeyFinder : public nlohmann::json_sax<json> {
 public:
  std::string duplicate;  // path of the first repeated key; "" when none

  bool null() override { return scalar(); }
  bool boolean(bool) override { return scalar(); }
  bool number_integer(number_integer_t) override { return scalar(); }
  bool number_unsigned(number_unsigned_t) override { return scalar(); }
  bool number_float(number_float_t, const string_t&) override { return scalar(); }
  bool string(string_t&) override { return scalar(); }
  bool binary(binary_t&) override { return scalar(); }
  bool start_object(std::size_t) override { return open(true); }
  bool end_object() override { return close(); }
  bool start_array(std::size_t) override { return open(false); }
  bool end_array() override { return close(); }
  bool key(string_t& k) override {
    Frame& f = frames_.back();
    if (!f.keys.insert(k).second) {
      duplicate = join(f.path, k);
      return false;  // stops the parse
    }
    f.key = k;
    return true;
  }
  bool parse_error(std::size_t, const std::string&, const nlohmann::detail::exception&) override {
    return false;  // the DOM parse reports syntax errors, with their offset
  }

 private:
  struct Frame {
    bool object;
    std::string path;
    std::set<std::string> keys;
    std::string key;        // object: the key whose value comes next
    std::size_t index = 0;  // array: the index of the next element
  };
  std::vector<Frame> frames_;

  std::string child_path() const {
    if (frames_.empty()) return "";
    const Frame& f = frames_.back();
    return f.object ? join(f.path, f.key) : fmt::format("{}[{}]", f.path, f.index);
  }
  bool scalar() {
    if (!frames_.empty() && !frames_.back().object) ++frames_.back().index;
    return true;
  }
  bool open(bool object) {
    frames_.push_back(Frame{object, child_path(), {}, {}, 0});
    return true;
  }
  bool close() {
    frames_.pop_back();
    return scalar();  // the finished object or array was one element of its parent
  }
};

// Messages quote strings from the file; a "\n" in one must not split the line.
std::string one_line(std::string_view s) {
  std::string out;
  for (char c : s) {
    const auto u = static_cast<unsigned char>(c);
    if (u < 0x20 || u == 0x7f) out += fmt::format("\\x{:02x}", u);
    else out += c;
  }
  return out;
}

}  // namespace

std::vector<Topology> topologies_from_text(std::string_view text) {
  try {
    json j;
    try {
      j = json::parse(text);
    } catch (const json::parse_error& e) {
      // e.byte is the offset where parsing stopped.
      throw std::runtime_error(fmt::format("not valid JSON (at byte {})", e.byte));
    }
    // Valid JSON, so this pass stops only at a duplicate key.
    DuplicateKeyFinder dups;
    json::sax_parse(text, &dups);
    if (!dups.duplicate.empty())
      fail(dups.duplicate, "duplicate key (JSON would silently keep the last value; give each key once)");
    return topologies_from_json(j);
  } catch (const std::runtime_error& e) {
    throw std::runtime_error(one_line(e.what()));
  }
}

std::vector<Topology> load_topology_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error(fmt::format("topology file {}: cannot open: {}", path, std::strerror(errno)));
  std::ostringstream text;
  text << in.rdbuf();
  if (in.bad()) throw std::runtime_error(fmt::format("topology file {}: cannot read: {}", path, std::strerror(errno)));
  try {
    return topologies_from_text(text.str());
  } catch (const std::runtime_error& e) {
    throw std::runtime_error(fmt::format("topology file {}: {}", one_line(path), e.what()));
  }
}

void save_topology_file(const std::string& path, const std::vector<Topology>& topos) {
  const json j = topos.size() == 1 ? topology_to_json(topos[0]) : topologies_to_json(topos);
  const std::string text = pretty(j);
  std::string tmp = path + ".XXXXXX";
  int fd = ::mkstemp(tmp.data());
  if (fd < 0) throw std::runtime_error(fmt::format("cannot write {}: {}", path, std::strerror(errno)));
  // mkstemp creates 0600; the cache is meant to be readable by every user.
  ::fchmod(fd, 0644);
  std::size_t off = 0;
  while (off < text.size()) {
    ssize_t w = ::write(fd, text.data() + off, text.size() - off);
    if (w < 0) {
      if (errno == EINTR) continue;
      const int e = errno;
      ::close(fd);
      ::unlink(tmp.c_str());
      throw std::runtime_error(fmt::format("cannot write {}: {}", path, std::strerror(e)));
    }
    off += static_cast<std::size_t>(w);
  }
  if (::close(fd) != 0 || ::rename(tmp.c_str(), path.c_str()) != 0) {
    const int e = errno;
    ::unlink(tmp.c_str());
    throw std::runtime_error(fmt::format("cannot write {}: {}", path, std::strerror(e)));
  }
}

void to_json(json& j, const Topology& t) { j = topology_to_json(t); }
void from_json(const json& j, Topology& t) { t = topology_from_json(j); }

std::string render_topology_json(const std::vector<Topology>& topos) {
  return pretty(topologies_to_json(topos, /*with_index=*/true));
}

}  // namespace nvtaskset::topo
