// SPDX-License-Identifier: Apache-2.0

//go:build integration

package driver

import (
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"nvtaskset.dev/k8s/internal/nvtaskset"
)

// Under --mps=multi-user the plugin's nvtaskset starts the multi-user MPS
// daemon (the stand-in, tests/fakemps, keeps -M on its command line), and
// each share's container gets its pipe directory, mounted, and named in
// CUDA_MPS_PIPE_DIRECTORY; pods of two users run at once on their TPCs.
func TestMultiUserMPS(t *testing.T) {
	n := newNodeCDI(t, 64, true)
	n.mps = nvtaskset.MPSMultiUser
	control := filepath.Join(n.dir, "mps-bin", "nvidia-cuda-mps-control")
	copyFile(t, need(t, "NVTASKSET_TEST_FAKEMPS"), control, 0o755)
	pipe := filepath.Join(n.dir, "mps-pipe")
	n.extraEnv = []string{"NVTASKSET_MPS_CONTROL=" + control, "CUDA_MPS_PIPE_DIRECTORY=" + pipe}
	t.Cleanup(func() {
		quit := exec.Command(control)
		quit.Env = append(os.Environ(), n.extraEnv...)
		quit.Stdin = strings.NewReader("quit\n")
		_ = quit.Run()
		if b, err := os.ReadFile(filepath.Join(pipe, "nvidia-cuda-mps-control.pid")); err == nil {
			pid := strings.TrimSpace(string(b))
			for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
				if _, err := os.Stat("/proc/" + pid); err != nil {
					return
				}
			}
			t.Errorf("the stand-in MPS daemon %s did not quit", pid)
		}
	})
	n.start()
	endpoint := n.register()
	a := newAllocator(t, n.slices(), deviceClass(t))
	c16, c32 := newClaim("a", 16), newClaim("b", 32)
	if !a.allocate(c16, "pod-a") || !a.allocate(c32, "pod-b") {
		t.Fatal("not allocated")
	}
	resp := n.prepare(endpoint, c16, c32)
	for _, c := range []string{string(c16.UID), string(c32.UID)} {
		if resp[c].Error != "" {
			t.Fatalf("prepare: %s", resp[c].Error)
		}
	}
	// The daemon runs in multi-user server mode.
	b, err := os.ReadFile(filepath.Join(pipe, "nvidia-cuda-mps-control.pid"))
	if err != nil {
		t.Fatalf("no MPS daemon started: %v", err)
	}
	cmdline, _ := os.ReadFile("/proc/" + strings.TrimSpace(string(b)) + "/cmdline")
	if args := strings.Split(string(cmdline), "\x00"); !contains(args, "-M") && !contains(args, "-dM") {
		t.Fatalf("the MPS daemon runs as %q, not a multi-user server", args)
	}
	// Each share's container: the pipe directory and the MPS client's queues.
	spec := n.edits(resp[string(c16.UID)].Devices[0].CdiDeviceIds...)
	env := strings.Join(spec.Process.Env, "\n")
	for _, want := range []string{"CUDA_MPS_PIPE_DIRECTORY=" + pipe, "CUDA_DEVICE_MAX_CONNECTIONS=8"} {
		if !strings.Contains(env, want) {
			t.Errorf("the container's environment lacks %s:\n%s", want, env)
		}
	}
	mounted := false
	for _, m := range spec.Mounts {
		mounted = mounted || (m.Source == pipe && m.Destination == pipe)
	}
	if !mounted {
		t.Errorf("the MPS pipe directory is not mounted: %+v", spec.Mounts)
	}
	// Two users' containers, each on its share's TPCs.
	img := image(t, n)
	st := n.status()
	for _, tc := range []struct {
		name, user string
		ids        []string
	}{{"a", "1001:1001", resp[string(c16.UID)].Devices[0].CdiDeviceIds}, {"b", "1002:1002", resp[string(c32.UID)].Devices[0].CdiDeviceIds}} {
		want := tpcs(t, holderTask(t, st, tc.name).TPCs)
		if got := podman(t, n, img, tc.user, tc.ids); !reflect.DeepEqual(got, want) {
			t.Fatalf("claim %s's container (user %s) ran on TPCs %v, want %v", tc.name, tc.user, got, want)
		}
	}
}
