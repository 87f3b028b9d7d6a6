// SPDX-License-Identifier: Apache-2.0

// Package cdispec writes the CDI spec of a prepared claim: one CDI device
// per share, whose container edits carry the share's partition to the
// container (the environment nvtaskset printed for it, the shim's
// directory mounted read-only, and where used the MPS pipe directory and
// the status directory).
package cdispec

import (
	"fmt"
	"path/filepath"
	"sort"
	"strings"

	"tags.cncf.io/container-device-interface/pkg/cdi"
	"tags.cncf.io/container-device-interface/pkg/parser"
	specs "tags.cncf.io/container-device-interface/specs-go"
)

// Vendor and Class make the CDI kind of every share: tpc.nvtaskset.dev/share.
const (
	Vendor = "tpc.nvtaskset.dev"
	Class  = "share"
)

// Kind is the CDI kind of the devices this plugin writes.
var Kind = Vendor + "/" + Class

// droppedEnv names what the CLI prints for a task on this host that means
// nothing, or harm, inside a container: the library path (the preload
// alone loads the shim, and replacing an image's LD_LIBRARY_PATH would
// break it), the claim's holder PID (a PID of the node's namespace), the
// node's driver path (the container's driver comes from NVIDIA's CDI
// device, where the shim finds it) and a sanitizer's setting.
var droppedEnv = map[string]bool{
	"LD_LIBRARY_PATH":         true,
	"NVTASKSET_PARTITION_PID": true,
	"NVTASKSET_REAL_LIBCUDA":  true,
	"ASAN_OPTIONS":            true,
}

// Device is one share's CDI device.
type Device struct {
	Name   string   // unique, never reused: the share ID or the claim UID
	Env    []string // NAME=VALUE, as nvtaskset --env-for printed them
	Mounts []Mount
}

// Mount is a host directory bind-mounted at the same path.
type Mount struct {
	Path     string
	ReadOnly bool
}

// ContainerEnv keeps the variables of env that a container's tasks need.
func ContainerEnv(env []string) []string {
	var out []string
	for _, kv := range env {
		name, _, _ := strings.Cut(kv, "=")
		if !droppedEnv[name] {
			out = append(out, kv)
		}
	}
	return out
}

// ShimDir is the directory of the shim the CLI preloads, which every share's
// container mounts read-only: LD_PRELOAD's path of libcuda.so.1, or, where
// the CLI preloads it by name (its path holds a character LD_PRELOAD splits
// at), the first directory of LD_LIBRARY_PATH, where the CLI puts it.
func ShimDir(env []string) (string, error) {
	var preload, libraryPath string
	for _, kv := range env {
		if v, ok := strings.CutPrefix(kv, "LD_PRELOAD="); ok {
			preload = v
		} else if v, ok := strings.CutPrefix(kv, "LD_LIBRARY_PATH="); ok {
			libraryPath = v
		}
	}
	for _, p := range strings.FieldsFunc(preload, func(r rune) bool { return r == ':' || r == ' ' }) {
		if p == "libcuda.so.1" {
			dirs := strings.FieldsFunc(libraryPath, func(r rune) bool { return r == ':' || r == ';' })
			if len(dirs) > 0 && filepath.IsAbs(dirs[0]) {
				return dirs[0], nil
			}
			break
		}
		if filepath.Base(p) == "libcuda.so.1" && filepath.IsAbs(p) {
			return filepath.Dir(p), nil
		}
	}
	return "", fmt.Errorf("nvtaskset --env-for set no LD_PRELOAD of the shim libcuda.so.1")
}

// QualifiedName is the CDI device ID of a share: tpc.nvtaskset.dev/share=NAME.
func QualifiedName(name string) string { return parser.QualifiedName(Vendor, Class, name) }

// SpecName is the file name (without extension) of a claim's spec.
func SpecName(claimUID string) string { return cdi.GenerateTransientSpecName(Vendor, Class, claimUID) }

// Build makes a claim's spec and validates it with the CDI library.
func Build(devices []Device) (*specs.Spec, error) {
	spec := &specs.Spec{Kind: Kind}
	for _, d := range devices {
		if err := parser.ValidateDeviceName(d.Name); err != nil {
			return nil, fmt.Errorf("CDI device name %q: %v", d.Name, err)
		}
		edits := specs.ContainerEdits{Env: append([]string(nil), d.Env...)}
		sort.Strings(edits.Env)
		for _, m := range d.Mounts {
			opts := []string{"bind", "nosuid", "nodev"}
			if m.ReadOnly {
				opts = append(opts, "ro")
			} else {
				opts = append(opts, "rw")
			}
			edits.Mounts = append(edits.Mounts, &specs.Mount{HostPath: m.Path, ContainerPath: m.Path, Type: "bind", Options: opts})
		}
		spec.Devices = append(spec.Devices, specs.Device{Name: d.Name, ContainerEdits: edits})
	}
	v, err := cdi.MinimumRequiredVersion(spec)
	if err != nil {
		return nil, err
	}
	spec.Version = v
	return spec, nil
}

// Writer writes and removes claims' specs in one directory.
type Writer struct {
	cache *cdi.Cache
	dir   string
}

// NewWriter writes into dir (created if missing).
func NewWriter(dir string) (*Writer, error) {
	c, err := cdi.NewCache(cdi.WithSpecDirs(dir), cdi.WithAutoRefresh(false))
	if err != nil {
		return nil, fmt.Errorf("CDI directory %s: %v", dir, err)
	}
	return &Writer{c, dir}, nil
}

// Write validates and writes a claim's spec (atomically: a runtime reads
// the old file or the new one).
func (w *Writer) Write(claimUID string, spec *specs.Spec) error {
	if err := w.cache.WriteSpec(spec, SpecName(claimUID)+".json"); err != nil {
		return fmt.Errorf("write CDI spec: %v", err)
	}
	return nil
}

// Remove deletes a claim's spec; a missing one is not an error.
func (w *Writer) Remove(claimUID string) error {
	return w.cache.RemoveSpec(SpecName(claimUID) + ".json")
}

// Path is where a claim's spec lives.
func (w *Writer) Path(claimUID string) string {
	return filepath.Join(w.dir, SpecName(claimUID)+".json")
}

// Lookup finds, in the CDI spec directories dirs, the first of names that
// is a device (e.g. NVIDIA's nvidia.com/gpu=GPU-<uuid> or =<index>).
func Lookup(dirs []string, names ...string) (string, error) {
	c, err := cdi.NewCache(cdi.WithSpecDirs(dirs...), cdi.WithAutoRefresh(false))
	if err != nil {
		return "", err
	}
	for _, n := range names {
		if c.GetDevice(n) != nil {
			return n, nil
		}
	}
	return "", nil
}
