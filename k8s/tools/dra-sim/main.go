// SPDX-License-Identifier: Apache-2.0

// dra-sim runs the DRA plugin on this node around a simulated cluster
// (internal/kubeletsim: the scheduler's allocator, a fake API server, the
// kubelet's calls on the plugin's real sockets, CDI injection), with the
// node's real nvtaskset and GPU:
//
//	dra-sim bench    --nvtaskset PATH [--claims 200] [--live 1,8,32]
//	dra-sim gpucheck --nvtaskset PATH --probe smid_probe [--mps off|multi-user] [--users 1001,1002]
//
// bench prints Prepare's and Unprepare's p50/p99 per claim and how they grow
// with the shares already live (bench/dra_prepare.sh); gpucheck prepares
// two shares of 16 and 32 TPCs and runs the probe with each share's CDI
// edits (docs/verification.md, "Kubernetes"). The binary is also the
// plugin's holder (internal/holder), as the plugin's own binary is.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
	"k8s.io/klog/v2"

	"nvtaskset.dev/k8s/internal/driver"
	"nvtaskset.dev/k8s/internal/holder"
	"nvtaskset.dev/k8s/internal/kubeletsim"
	"nvtaskset.dev/k8s/internal/nvtaskset"

	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

const node = "node-1"

func main() {
	if holder.IsHolder() {
		holder.Main()
		return
	}
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: dra-sim bench|gpucheck [flags]")
		os.Exit(2)
	}
	klog.InitFlags(nil)
	_ = flag.Set("v", "0")
	_ = flag.Set("stderrthreshold", "FATAL")
	_ = flag.Set("logtostderr", "false")
	var err error
	switch os.Args[1] {
	case "bench":
		err = bench(os.Args[2:])
	case "gpucheck":
		err = gpucheck(os.Args[2:])
	default:
		err = fmt.Errorf("unknown command %q", os.Args[1])
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "dra-sim: %v\n", err)
		os.Exit(1)
	}
}

// sim is the plugin on this node, registered with a simulated kubelet.
type sim struct {
	dir     string
	api     *fake.Clientset
	d       *driver.Driver
	k       *kubeletsim.Kubelet
	sched   *kubeletsim.Scheduler
	cli     *nvtaskset.CLI
	cdiDir  string
	counter int
}

func start(ctx context.Context, cliPath string, mps nvtaskset.MPSMode, pipeDir string) (*sim, error) {
	dir, err := os.MkdirTemp("", "dra-sim-")
	if err != nil {
		return nil, err
	}
	os.Chmod(dir, 0o755)
	for _, d := range []string{"state", "cdi", "plugins", "registry"} {
		if err := os.MkdirAll(filepath.Join(dir, d), 0o755); err != nil {
			return nil, err
		}
	}
	exe, err := os.Executable()
	if err != nil {
		return nil, err
	}
	s := &sim{dir: dir, api: kubeletsim.NewAPI(node), cdiDir: filepath.Join(dir, "cdi")}
	s.cli = &nvtaskset.CLI{Path: cliPath, Timeout: 120 * time.Second}
	s.d, err = driver.New(ctx, driver.Options{
		NodeName: node, CLI: s.cli, HolderExe: exe, StateDir: filepath.Join(dir, "state"), CDIDir: s.cdiDir,
		CDISpecDirs: []string{"/etc/cdi", "/var/run/cdi"}, NvidiaCDI: driver.NvidiaCDIAuto, MPS: mps, MPSPipeDir: pipeDir,
		StatusDir: envOr("NVTASKSET_STATUS_DIR", "/dev/shm"), Client: s.api, StopGrace: 5 * time.Second,
	})
	if err != nil {
		return nil, err
	}
	if err := s.d.Start(ctx, 0, kubeletplugin.PluginDataDirectoryPath(filepath.Join(dir, "plugins")),
		kubeletplugin.RegistrarDirectoryPath(filepath.Join(dir, "registry"))); err != nil {
		return nil, err
	}
	if s.k, _, err = kubeletsim.Register(ctx, s.api, filepath.Join(dir, "registry")); err != nil {
		return nil, err
	}
	slices, err := kubeletsim.Slices(ctx, s.api)
	if err != nil {
		return nil, err
	}
	class := &resourceapi.DeviceClass{ObjectMeta: metav1.ObjectMeta{Name: driver.Name},
		Spec: resourceapi.DeviceClassSpec{Selectors: []resourceapi.DeviceSelector{{CEL: &resourceapi.CELDeviceSelector{
			Expression: `device.driver == "` + driver.Name + `"`}}}}}
	s.sched = &kubeletsim.Scheduler{Node: node, Slices: slices, Classes: []*resourceapi.DeviceClass{class}}
	return s, nil
}

// claim allocates a claim of tpcs TPCs for a pod, as the scheduler would.
func (s *sim) claim(ctx context.Context, tpcs int64) (*resourceapi.ResourceClaim, error) {
	s.counter++
	c := kubeletsim.Claim("default", fmt.Sprintf("claim-%d", s.counter), driver.Name, tpcs)
	ok, err := s.sched.Allocate(ctx, c, fmt.Sprintf("pod-%d", s.counter))
	if err != nil {
		return nil, err
	}
	if !ok {
		return nil, fmt.Errorf("%d TPCs cannot be allocated now", tpcs)
	}
	return c, nil
}

// prepare prepares c, or says why not.
func (s *sim) prepare(ctx context.Context, c *resourceapi.ResourceClaim) ([]string, error) {
	resp, err := s.k.Prepare(ctx, c)
	if err != nil {
		return nil, err
	}
	r := resp[string(c.UID)]
	if r.Error != "" {
		return nil, fmt.Errorf("%s", r.Error)
	}
	return r.Devices[0].CdiDeviceIds, nil
}

func (s *sim) unprepare(ctx context.Context, c *resourceapi.ResourceClaim) error {
	resp, err := s.k.Unprepare(ctx, c)
	if err != nil {
		return err
	}
	if e := resp[string(c.UID)].Error; e != "" {
		return fmt.Errorf("%s", e)
	}
	s.sched.Release(c)
	return nil
}

func (s *sim) stop() {
	s.k.Close()
	s.d.Stop()
	for _, p := range holder.Running(filepath.Join(s.dir, "state")) {
		_ = p.Stop(5 * time.Second)
	}
	os.RemoveAll(s.dir)
}

func envOr(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}
