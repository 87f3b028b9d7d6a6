// SPDX-License-Identifier: Apache-2.0

// Package nvtaskset runs the installed nvtaskset CLI, the one place where
// partitions are planned and claimed: the plugin never plans or encodes a
// mask itself (as the Slurm plugin, it asks the CLI with --env-for).
package nvtaskset

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os/exec"
	"sort"
	"strconv"
	"strings"
	"time"
)

// MPSMode says how the claimed tasks share the GPU.
type MPSMode string

const (
	// MPSOff: no MPS (nvtaskset --no-mps); each pod's processes time-slice
	// with other pods' on their own TPCs.
	MPSOff MPSMode = "off"
	// MPSMultiUser: one multi-user MPS control daemon per node, started by
	// root (nvtaskset --mps-multi-user), which serves pods of every UID.
	MPSMultiUser MPSMode = "multi-user"
)

// ParseMPSMode accepts the flag's values.
func ParseMPSMode(s string) (MPSMode, error) {
	switch MPSMode(s) {
	case MPSOff, MPSMultiUser:
		return MPSMode(s), nil
	}
	return "", fmt.Errorf("--mps=%q: want %q or %q", s, MPSOff, MPSMultiUser)
}

// Role is nvtaskset's role of a task (docs/design.md, "Roles").
type Role string

const (
	RoleNone            Role = ""
	RoleLatencyCritical Role = "latency-critical"
	RoleBestEffort      Role = "best-effort"
)

// GPU is one GPU as `nvtaskset --topology --json` describes it.
type GPU struct {
	Index             int
	Name              string
	UUID              string
	PCIBusID          string
	ComputeCapability string // "9.0"
	SMCount           int
	DriverVersion     int    // the CUDA driver API version, e.g. 13000
	DriverRelease     string // the kernel driver's release, e.g. "580.95.05"; may be empty
	TPCs              int
	GPCs              int
}

// Task is one row of `nvtaskset --status --json`.
type Task struct {
	PID     int      `json:"pid"`
	UID     int      `json:"uid"`
	Device  string   `json:"device"`
	TPCs    string   `json:"tpcs"`
	Role    *string  `json:"role"`
	Command string   `json:"command"`
	Argv    []string `json:"argv"`
}

// CLI runs one nvtaskset binary.
type CLI struct {
	Path    string        // the binary
	Env     []string      // its environment (nil: the plugin's own)
	Timeout time.Duration // per call; a hung driver must not hang Prepare
}

// Error is a failed nvtaskset call: its one-line reason.
type Error struct {
	Args   []string
	Reason string
}

func (e *Error) Error() string { return e.Reason }

func (c *CLI) run(ctx context.Context, args ...string) ([]byte, error) {
	timeout := c.Timeout
	if timeout <= 0 {
		timeout = 120 * time.Second
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, c.Path, args...)
	cmd.Env = c.Env
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	if ctx.Err() != nil {
		return nil, &Error{args, fmt.Sprintf("nvtaskset %s: no answer in %s", strings.Join(args, " "), timeout)}
	}
	if err != nil {
		var exit *exec.ExitError
		if !errors.As(err, &exit) {
			return nil, &Error{args, fmt.Sprintf("cannot run %s: %v", c.Path, err)}
		}
		return nil, &Error{args, reason(stderr.String(), exit.ExitCode())}
	}
	return stdout.Bytes(), nil
}

// reason: the CLI's own one-line error (its last "nvtaskset: " line), or
// the exit status when it said nothing.
func reason(stderr string, code int) string {
	lines := strings.Split(strings.TrimSpace(stderr), "\n")
	for i := len(lines) - 1; i >= 0; i-- {
		if l := strings.TrimSpace(lines[i]); strings.HasPrefix(l, "nvtaskset: ") {
			return strings.TrimPrefix(l, "nvtaskset: ")
		}
	}
	if l := strings.TrimSpace(lines[len(lines)-1]); l != "" {
		return l
	}
	return "nvtaskset exited with status " + strconv.Itoa(code)
}

// Topology lists the node's GPUs.
func (c *CLI) Topology(ctx context.Context) ([]GPU, error) {
	out, err := c.run(ctx, "--topology", "--json")
	if err != nil {
		return nil, err
	}
	return parseTopology(out)
}

type topologyJSON struct {
	Devices []struct {
		Device struct {
			Index             int    `json:"index"`
			Name              string `json:"name"`
			UUID              string `json:"uuid"`
			PCIBusID          string `json:"pci_bus_id"`
			ComputeCapability string `json:"compute_capability"`
			SMCount           int    `json:"sm_count"`
			DriverVersion     int    `json:"driver_version"`
			DriverRelease     string `json:"driver_release"`
		} `json:"device"`
		TPCs []json.RawMessage `json:"tpcs"`
		GPCs []json.RawMessage `json:"gpcs"`
	} `json:"devices"`
}

func parseTopology(out []byte) ([]GPU, error) {
	var t topologyJSON
	if err := json.Unmarshal(out, &t); err != nil {
		return nil, fmt.Errorf("nvtaskset --topology --json: %v", err)
	}
	gpus := make([]GPU, 0, len(t.Devices))
	for _, d := range t.Devices {
		gpus = append(gpus, GPU{
			Index: d.Device.Index, Name: d.Device.Name, UUID: d.Device.UUID, PCIBusID: d.Device.PCIBusID,
			ComputeCapability: d.Device.ComputeCapability, SMCount: d.Device.SMCount,
			DriverVersion: d.Device.DriverVersion, DriverRelease: d.Device.DriverRelease,
			TPCs: len(d.TPCs), GPCs: len(d.GPCs),
		})
	}
	return gpus, nil
}

// Share is what one claimed share asks of the CLI.
type Share struct {
	Holder           int    // the process the claim lives as long as (--env-for)
	GPU              string // the GPU's UUID (-d)
	TPCs             int    // -n COUNT
	List             string // -t LIST instead of a count: re-claiming an adopted share's exact TPCs
	Spread           bool   // --spread
	Role             Role
	PartitionSMCount bool // --partition-sm-count
	MPS              MPSMode
}

// Args is the CLI's command line for s: the same parse, plan and claim as
// `nvtaskset -n N --exclusive CMD`, with the status entry on s.Holder.
func (s Share) Args() []string {
	args := []string{"--env-for", strconv.Itoa(s.Holder), "-d", s.GPU}
	if s.List != "" {
		args = append(args, "-t", s.List)
	} else {
		args = append(args, "-n", strconv.Itoa(s.TPCs))
	}
	switch s.Role {
	case RoleLatencyCritical:
		args = append(args, "--latency-critical")
	case RoleBestEffort:
		args = append(args, "--best-effort")
	default:
		args = append(args, "--exclusive")
	}
	if s.Spread {
		args = append(args, "--spread")
	}
	if s.PartitionSMCount {
		args = append(args, "--partition-sm-count")
	}
	if s.MPS == MPSMultiUser {
		args = append(args, "--mps-multi-user")
	} else {
		args = append(args, "--no-mps")
	}
	return args
}

// Claimed is what nvtaskset claimed for a share.
type Claimed struct {
	Env  []string // NAME=VALUE: the variables its tasks need
	TPCs string   // the TPCs chosen, as --status lists them ("0-7,16")
}

// Claim plans and claims s (nvtaskset --env-for ... --json).
func (c *CLI) Claim(ctx context.Context, s Share) (Claimed, error) {
	out, err := c.run(ctx, append(s.Args(), "--json")...)
	if err != nil {
		return Claimed{}, err
	}
	var j struct {
		Environment map[string]string `json:"environment"`
		Partitions  []struct {
			Device string `json:"device"`
			TPCs   string `json:"tpcs"`
		} `json:"partitions"`
	}
	if err := json.Unmarshal(out, &j); err != nil {
		return Claimed{}, fmt.Errorf("nvtaskset --env-for --json: %v", err)
	}
	var got Claimed
	for name, value := range j.Environment {
		got.Env = append(got.Env, name+"="+value)
	}
	sort.Strings(got.Env)
	for _, p := range j.Partitions {
		if strings.EqualFold(p.Device, s.GPU) {
			got.TPCs = p.TPCs
		}
	}
	if got.TPCs == "" || len(got.Env) == 0 {
		return Claimed{}, fmt.Errorf("nvtaskset --env-for --json named no partition of %s: %s", s.GPU, strings.TrimSpace(string(out)))
	}
	return got, nil
}

// Status lists every live partition on the node.
func (c *CLI) Status(ctx context.Context) ([]Task, error) {
	out, err := c.run(ctx, "--status", "--json")
	if err != nil {
		return nil, err
	}
	var s struct {
		Tasks []Task `json:"tasks"`
	}
	if err := json.Unmarshal(out, &s); err != nil {
		return nil, fmt.Errorf("nvtaskset --status --json: %v", err)
	}
	return s.Tasks, nil
}

// ParseList expands a TPC list as nvtaskset prints it ("0-3,8") into its
// TPCs, in order.
func ParseList(list string) ([]int, error) {
	var out []int
	for _, part := range strings.Split(list, ",") {
		lo, hi, ranged := strings.Cut(part, "-")
		a, err := strconv.Atoi(lo)
		b := a
		if err == nil && ranged {
			b, err = strconv.Atoi(hi)
		}
		if err != nil || b < a {
			return nil, fmt.Errorf("not a TPC list: %q", list)
		}
		for k := a; k <= b; k++ {
			out = append(out, k)
		}
	}
	return out, nil
}
