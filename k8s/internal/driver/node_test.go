// SPDX-License-Identifier: Apache-2.0

//go:build integration

package driver

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	oci "github.com/opencontainers/runtime-spec/specs-go"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
	drapb "k8s.io/kubelet/pkg/apis/dra/v1"
	registerapi "k8s.io/kubelet/pkg/apis/pluginregistration/v1"

	"nvtaskset.dev/k8s/internal/cdispec"
	"nvtaskset.dev/k8s/internal/holder"
	"nvtaskset.dev/k8s/internal/kubeletsim"
	"nvtaskset.dev/k8s/internal/nvtaskset"
)

// node is one node under test: the project's real nvtaskset and shim, the
// stand-in driver posing as a GPU of `tpcs` TPCs (tests/fakecuda; TPC k
// is mask bit k), a fake API server (client-go's fake clientset), and the
// plugin, called over its real sockets exactly as the kubelet calls it.
// The stand-in NVIDIA Container Toolkit is a CDI spec nvidia.com/gpu=<UUID>
// that brings the stand-in driver into a container, as NVIDIA's brings the
// real one.
type node struct {
	t                            *testing.T
	dir, record, cli, shimDir    string
	launcher, fakecuda, nvCDIDir string
	cdiDir, nvSpec               string
	env                          []string
	tpcs                         int
	client                       *fake.Clientset
	ctx                          context.Context
	d                            *Driver
	gpus                         []nvtaskset.GPU
	mps                          nvtaskset.MPSMode
	extraEnv                     []string
	claims                       []string // the UIDs this node prepared
	k                            *kubeletsim.Kubelet
}

func need(t *testing.T, name string) string {
	v := os.Getenv(name)
	if v == "" {
		t.Fatalf("%s is not set: run these tests through ctest (k8s_dra), which builds and names the project's binaries", name)
	}
	return v
}

func copyFile(t *testing.T, from, to string, mode os.FileMode) {
	t.Helper()
	b, err := os.ReadFile(from)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Dir(to), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(to, b, mode); err != nil {
		t.Fatal(err)
	}
}

func newNode(t *testing.T, tpcs int) *node { return newNodeCDI(t, tpcs, false) }

// newNodeCDI with systemCDI writes the CDI specs where every runtime reads
// them, /var/run/cdi (the plugin's) and /etc/cdi (the stand-in NVIDIA
// toolkit's), as podman 4.3 reads no other directory; its files are
// named for this node alone and removed with it.
func newNodeCDI(t *testing.T, tpcs int, systemCDI bool) *node {
	t.Helper()
	n := &node{t: t, tpcs: tpcs, mps: nvtaskset.MPSOff}
	// Readable by every user (a pod of another UID loads the shim), like a
	// node's /opt/nvtaskset, wherever the build tree is.
	dir, err := os.MkdirTemp("", "nvtaskset-dra-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	n.dir = dir
	os.Chmod(dir, 0o755)
	cli := need(t, "NVTASKSET_TEST_CLI")
	n.cli = filepath.Join(dir, "nv", "bin", "nvtaskset")
	copyFile(t, cli, n.cli, 0o755)
	n.shimDir = filepath.Join(dir, "nv", "lib", "nvtaskset")
	copyFile(t, filepath.Join(filepath.Dir(cli), "..", "lib", "nvtaskset", "libcuda.so.1"), filepath.Join(n.shimDir, "libcuda.so.1"), 0o755)
	n.fakecuda = filepath.Join(dir, "drv", "libcuda.so.1")
	copyFile(t, need(t, "NVTASKSET_TEST_FAKECUDA"), n.fakecuda, 0o755)
	n.launcher = filepath.Join(dir, "app", "launcher")
	copyFile(t, need(t, "NVTASKSET_TEST_LAUNCHER"), n.launcher, 0o755)
	for _, d := range []string{"status", "cache", "rec", "cdi", "nvidia-cdi", "state", "plugins", "registry"} {
		if err := os.MkdirAll(filepath.Join(dir, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	os.Chmod(filepath.Join(dir, "rec"), 0o777)
	os.Chmod(filepath.Join(dir, "status"), 0o777|os.ModeSticky) // as /dev/shm (CheckStatusDir)
	n.record = filepath.Join(dir, "rec", "record")
	n.nvCDIDir, n.cdiDir = filepath.Join(dir, "nvidia-cdi"), filepath.Join(dir, "cdi")
	n.nvSpec = "nvidia.json"
	if systemCDI {
		n.nvCDIDir, n.cdiDir = "/etc/cdi", "/var/run/cdi"
		n.nvSpec = "nvtaskset-test-" + filepath.Base(dir) + ".json"
		for _, d := range []string{n.nvCDIDir, n.cdiDir} {
			if err := os.MkdirAll(d, 0o755); err != nil {
				t.Fatal(err)
			}
		}
		t.Cleanup(func() {
			os.Remove(filepath.Join(n.nvCDIDir, n.nvSpec))
			for _, uid := range n.claims {
				os.Remove(filepath.Join(n.cdiDir, cdispec.SpecName(uid)+".json"))
			}
		})
	}
	n.env = []string{
		"PATH=/usr/sbin:/usr/bin:/sbin:/bin", "HOME=" + dir,
		"NVTASKSET_REAL_LIBCUDA=" + n.fakecuda,
		"FAKECUDA_SM_COUNT=" + strconv.Itoa(2*tpcs),
		"FAKECUDA_RECORD=" + n.record,
		"NVTASKSET_STATUS_DIR=" + filepath.Join(dir, "status"),
		"XDG_CACHE_HOME=" + filepath.Join(dir, "cache"),
	}
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	n.ctx = ctx
	// The API server knows the node: the slices are owned by it.
	n.client = kubeletsim.NewAPI(testNode)
	gpus, err := n.nvtaskset().Topology(ctx)
	if err != nil || len(gpus) != 1 {
		t.Fatalf("the stand-in GPU: %v, %v", gpus, err)
	}
	n.gpus = gpus
	n.writeNvidiaSpec()
	t.Cleanup(func() {
		if n.d != nil {
			n.d.Stop()
		}
		// No holder outlives a test.
		for _, p := range holder.Running(filepath.Join(n.dir, "state")) {
			_ = p.Stop(time.Second)
		}
	})
	return n
}

func (n *node) nvtaskset() *nvtaskset.CLI {
	return &nvtaskset.CLI{Path: n.cli, Env: append(append([]string(nil), n.env...), n.extraEnv...), Timeout: 30 * time.Second}
}

// writeNvidiaSpec is the stand-in for the NVIDIA Container Toolkit's CDI
// spec: the GPU's device brings the driver (here the stand-in) into the
// container.
func (n *node) writeNvidiaSpec() {
	spec := fmt.Sprintf(`{"cdiVersion":"0.5.0","kind":"nvidia.com/gpu","devices":[{"name":%q,"containerEdits":{
"env":["NVTASKSET_REAL_LIBCUDA=%s","FAKECUDA_SM_COUNT=%d","FAKECUDA_RECORD=%s"],
"mounts":[{"hostPath":%q,"containerPath":%q,"options":["ro","bind"]},{"hostPath":%q,"containerPath":%q,"options":["rw","bind"]}]}}]}`,
		n.gpus[0].UUID, n.fakecuda, 2*n.tpcs, n.record, filepath.Dir(n.fakecuda), filepath.Dir(n.fakecuda),
		filepath.Dir(n.record), filepath.Dir(n.record))
	if err := os.WriteFile(filepath.Join(n.nvCDIDir, n.nvSpec), []byte(spec), 0o644); err != nil {
		n.t.Fatal(err)
	}
}

func (n *node) options() Options {
	exe, err := os.Executable()
	if err != nil {
		n.t.Fatal(err)
	}
	return Options{
		NodeName: testNode, CLI: n.nvtaskset(), HolderExe: exe, StateDir: filepath.Join(n.dir, "state"),
		CDIDir: n.cdiDir, CDISpecDirs: []string{n.nvCDIDir}, NvidiaCDI: NvidiaCDIRequired,
		MPS: n.mps, MPSPipeDir: filepath.Join(n.dir, "mps-pipe"), StatusDir: filepath.Join(n.dir, "status"),
		Client: n.client, StopGrace: 5 * time.Second,
		Fatal: func(err error) { n.t.Errorf("fatal plugin error: %v", err) },
	}
}

// start runs the plugin as its binary does: New, then Start with its
// sockets in this node's kubelet directories.
func (n *node) start() {
	n.t.Helper()
	d, err := New(n.ctx, n.options())
	if err != nil {
		n.t.Fatal(err)
	}
	if err := d.Start(n.ctx, 0,
		kubeletplugin.PluginDataDirectoryPath(filepath.Join(n.dir, "plugins")),
		kubeletplugin.RegistrarDirectoryPath(filepath.Join(n.dir, "registry"))); err != nil {
		n.t.Fatal(err)
	}
	n.d = d
}

// restart stops the plugin (its holders stay) and starts a new one on the
// same state, as a DaemonSet's rolling update does.
func (n *node) restart() {
	n.d.Stop()
	n.d = nil
	n.start()
}

// register does what the kubelet's plugin watcher does with a new socket
// in its registry directory (kubeletsim.Register), and checks what the
// plugin says of itself.
func (n *node) register() string {
	n.t.Helper()
	k, info, err := kubeletsim.Register(n.ctx, n.client, filepath.Join(n.dir, "registry"))
	if err != nil {
		n.t.Fatal(err)
	}
	n.t.Cleanup(k.Close)
	if info.Type != registerapi.DRAPlugin || info.Name != Name || !contains(info.SupportedVersions, "v1.DRAPlugin") {
		n.t.Fatalf("GetInfo = %+v", info)
	}
	n.k = k
	return info.Endpoint
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// slices waits for the ResourceSlices the plugin publishes in the API.
func (n *node) slices() []*resourceapi.ResourceSlice {
	n.t.Helper()
	s, err := kubeletsim.Slices(n.ctx, n.client)
	if err != nil {
		n.t.Fatal(err)
	}
	return s
}

// prepare calls NodePrepareResources for the claims (stored in the API
// first), as the kubelet does before it starts their pod.
func (n *node) prepare(endpoint string, claims ...*resourceapi.ResourceClaim) map[string]*drapb.NodePrepareResourceResponse {
	n.t.Helper()
	if endpoint != n.k.Endpoint {
		n.t.Fatalf("endpoint %s, registered %s", endpoint, n.k.Endpoint)
	}
	for _, c := range claims {
		n.claims = append(n.claims, string(c.UID))
	}
	resp, err := n.k.Prepare(n.ctx, claims...)
	if err != nil {
		n.t.Fatal(err)
	}
	return resp
}

func (n *node) unprepare(endpoint string, claims ...*resourceapi.ResourceClaim) map[string]*drapb.NodeUnprepareResourceResponse {
	n.t.Helper()
	resp, err := n.k.Unprepare(n.ctx, claims...)
	if err != nil {
		n.t.Fatal(err)
	}
	return resp
}

// status is `nvtaskset --status --json` on this node.
func (n *node) status() []nvtaskset.Task {
	n.t.Helper()
	tasks, err := n.nvtaskset().Status(n.ctx)
	if err != nil {
		n.t.Fatal(err)
	}
	return tasks
}

// tpcs expands "0-3,8" to its TPCs.
func tpcs(t *testing.T, list string) []int {
	t.Helper()
	out, err := nvtaskset.ParseList(list)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// recorded is the TPCs the stand-in driver last ran pid's kernel on: the
// zeros of the disable mask it recorded (identity layout).
func (n *node) recorded(pid int) []int {
	n.t.Helper()
	b, err := os.ReadFile(n.record)
	if err != nil {
		n.t.Fatal(err)
	}
	mask := ""
	for _, l := range strings.Split(string(b), "\n") {
		f := strings.Fields(l)
		if len(f) >= 4 && (pid == 0 || f[0] == strconv.Itoa(pid)) {
			mask = f[3]
		}
	}
	if mask == "" {
		n.t.Fatalf("the stand-in recorded no kernel of pid %d: %q", pid, b)
	}
	var out []int
	hex := strings.TrimPrefix(mask, "0x")
	for k := 0; k < n.tpcs; k++ {
		d := k / 4
		bit := 0
		if d < len(hex) {
			v, _ := strconv.ParseUint(string(hex[len(hex)-1-d]), 16, 8)
			bit = int(v>>(k%4)) & 1
		}
		if bit == 0 {
			out = append(out, k)
		}
	}
	return out
}

// edits is what a container runtime applies for the CDI devices.
func (n *node) edits(ids ...string) *oci.Spec {
	n.t.Helper()
	spec, err := kubeletsim.Edits([]string{n.nvCDIDir, n.cdiDir}, ids...)
	if err != nil {
		n.t.Fatal(err)
	}
	return spec
}

// run starts the project's test program with a container's CDI edits
// (its environment; the mounts are at the same paths on this node) and
// returns the TPCs the stand-in ran its kernel on.
func (n *node) run(ids ...string) []int {
	n.t.Helper()
	spec := n.edits(ids...)
	cmd := exec.Command(n.launcher, "--kernels", "1")
	cmd.Env = spec.Process.Env
	out, err := cmd.CombinedOutput()
	if err != nil {
		n.t.Fatalf("the program with %v: %v\n%s", ids, err, out)
	}
	return n.recorded(cmd.Process.Pid)
}

func parseJSON(t *testing.T, b []byte, v any) {
	if err := json.Unmarshal(b, v); err != nil {
		t.Fatal(err)
	}
}

func sortedInts(a []int) []int { b := append([]int(nil), a...); sort.Ints(b); return b }
