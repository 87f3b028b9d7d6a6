// SPDX-License-Identifier: Apache-2.0

// nvtaskset-dra-plugin is the DRA kubelet plugin of tpc.nvtaskset.dev
// (docs/kubernetes.md): pods ask for a share of a GPU's TPCs and their
// containers run on TPCs that no other pod holds.
//
// Started with NVTASKSET_DRA_HOLDER set, the same binary is a holder: a
// process that lives as long as one prepared share (internal/holder).
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
	"k8s.io/klog/v2"

	"nvtaskset.dev/k8s/internal/driver"
	"nvtaskset.dev/k8s/internal/holder"
	"nvtaskset.dev/k8s/internal/nvtaskset"
)

type flags struct {
	nodeName, kubeconfig, cli, pluginsDir, registrarDir, cdiDir, cdiSpecDirs, stateDir string
	mps, mpsPipeDir, statusDir, nvidiaCDI, nvidiaKind                                  string
	defaultTPCs                                                                        int
	rescan, cliTimeout                                                                 time.Duration
}

func main() {
	if holder.IsHolder() {
		holder.Main()
		return
	}
	klog.InitFlags(nil)
	var f flags
	flag.StringVar(&f.nodeName, "node-name", os.Getenv("NODE_NAME"), "this node's name (default: $NODE_NAME)")
	flag.StringVar(&f.kubeconfig, "kubeconfig", "", "kubeconfig file (default: in-cluster configuration)")
	flag.StringVar(&f.cli, "nvtaskset", "nvtaskset", "the nvtaskset binary that plans and claims the shares")
	flag.StringVar(&f.pluginsDir, "kubelet-plugins-dir", "/var/lib/kubelet/plugins/"+driver.Name, "the plugin's kubelet directory (its DRA socket)")
	flag.StringVar(&f.registrarDir, "kubelet-registrar-dir", "/var/lib/kubelet/plugins_registry", "the kubelet's plugin registration directory")
	flag.StringVar(&f.cdiDir, "cdi-dir", "/var/run/cdi", "where the claims' CDI specs are written")
	flag.StringVar(&f.cdiSpecDirs, "cdi-spec-dirs", "/etc/cdi,/var/run/cdi", "where the NVIDIA Container Toolkit's CDI spec is looked for (comma-separated)")
	flag.StringVar(&f.stateDir, "state-dir", "/var/lib/nvtaskset-dra", "the checkpoint of prepared claims")
	flag.StringVar(&f.mps, "mps", string(nvtaskset.MPSMultiUser), "multi-user: one multi-user MPS daemon serves every pod (nvtaskset --mps-multi-user); off: pods time-slice (--no-mps)")
	flag.StringVar(&f.mpsPipeDir, "mps-pipe-dir", envOr("CUDA_MPS_PIPE_DIRECTORY", "/tmp/nvidia-mps"), "the MPS pipe directory mounted into every pod")
	flag.StringVar(&f.statusDir, "status-dir", envOr("NVTASKSET_STATUS_DIR", "/dev/shm"), "nvtaskset's status directory, mounted into pods of role shares")
	flag.StringVar(&f.nvidiaCDI, "nvidia-cdi", string(driver.NvidiaCDIRequired), "required: compose each share with the NVIDIA CDI device of its GPU; auto: where one exists, else NVIDIA_VISIBLE_DEVICES; off: NVIDIA_VISIBLE_DEVICES only")
	flag.StringVar(&f.nvidiaKind, "nvidia-cdi-kind", "nvidia.com/gpu", "the CDI kind of NVIDIA's GPU devices")
	flag.IntVar(&f.defaultTPCs, "default-tpcs", driver.DefaultTPCs, "the TPCs a claim that does not name `tpcs` gets")
	flag.DurationVar(&f.rescan, "rescan-interval", time.Minute, "how often the GPUs are listed again (slices republished when they change); 0: never")
	flag.DurationVar(&f.cliTimeout, "nvtaskset-timeout", 120*time.Second, "the longest one nvtaskset call may take")
	flag.Parse()
	if err := run(f); err != nil {
		fmt.Fprintf(os.Stderr, "nvtaskset-dra-plugin: %v\n", err)
		os.Exit(1)
	}
}

func envOr(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}

func run(f flags) error {
	if flag.NArg() > 0 {
		return fmt.Errorf("unexpected argument %q", flag.Arg(0))
	}
	if f.nodeName == "" {
		return errors.New("--node-name (or $NODE_NAME) is required")
	}
	mps, err := nvtaskset.ParseMPSMode(f.mps)
	if err != nil {
		return err
	}
	nv := driver.NvidiaCDI(f.nvidiaCDI)
	if nv != driver.NvidiaCDIRequired && nv != driver.NvidiaCDIAuto && nv != driver.NvidiaCDIOff {
		return fmt.Errorf("--nvidia-cdi=%q: want required, auto or off", f.nvidiaCDI)
	}
	if f.defaultTPCs < 1 {
		return fmt.Errorf("--default-tpcs=%d: at least 1", f.defaultTPCs)
	}
	for _, p := range []string{f.mpsPipeDir, f.statusDir} {
		if !filepath.IsAbs(p) {
			return fmt.Errorf("%q: not an absolute path", p)
		}
	}
	var cfg *rest.Config
	if f.kubeconfig != "" {
		cfg, err = clientcmd.BuildConfigFromFlags("", f.kubeconfig)
	} else {
		cfg, err = rest.InClusterConfig()
	}
	if err != nil {
		return fmt.Errorf("kubernetes client configuration: %w", err)
	}
	client, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return err
	}
	ctx, cancel := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer cancel()
	ctx, cancelCause := context.WithCancelCause(ctx)
	logger := klog.FromContext(ctx)
	// The CLI runs without the preload or library path of a task: what it
	// prints for a share must not carry the plugin's own.
	env := []string{}
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "LD_PRELOAD=") {
			env = append(env, kv)
		}
	}
	d, err := driver.New(ctx, driver.Options{
		NodeName:    f.nodeName,
		CLI:         &nvtaskset.CLI{Path: f.cli, Env: env, Timeout: f.cliTimeout},
		StateDir:    f.stateDir,
		CDIDir:      f.cdiDir,
		CDISpecDirs: strings.Split(f.cdiSpecDirs, ","),
		NvidiaCDI:   nv,
		NvidiaKind:  f.nvidiaKind,
		MPS:         mps,
		MPSPipeDir:  f.mpsPipeDir,
		StatusDir:   f.statusDir,
		DefaultTPCs: f.defaultTPCs,
		Client:      client,
		Fatal:       cancelCause,
	})
	if err != nil {
		return err
	}
	// The kubelet makes its own directories; the plugin's is ours.
	if err := os.MkdirAll(f.pluginsDir, 0o750); err != nil {
		return err
	}
	if err := d.Start(ctx, f.rescan,
		kubeletplugin.PluginDataDirectoryPath(f.pluginsDir),
		kubeletplugin.RegistrarDirectoryPath(f.registrarDir)); err != nil {
		return err
	}
	logger.Info("Serving", "driver", driver.Name, "node", f.nodeName, "mps", mps)
	<-ctx.Done()
	d.Stop()
	if err := context.Cause(ctx); err != nil && !errors.Is(err, context.Canceled) {
		return err
	}
	return nil
}
