// SPDX-License-Identifier: Apache-2.0

package nvtaskset

import (
	"reflect"
	"testing"
)

func TestShareArgs(t *testing.T) {
	const gpu = "GPU-00000000-0000-0000-0000-000000000001"
	for _, tc := range []struct {
		name  string
		share Share
		want  []string
	}{
		{"exclusive", Share{Holder: 42, GPU: gpu, TPCs: 16},
			[]string{"--env-for", "42", "-d", gpu, "-n", "16", "--exclusive", "--no-mps"}},
		{"spread, SM count, multi-user MPS", Share{Holder: 7, GPU: gpu, TPCs: 8, Spread: true, PartitionSMCount: true, MPS: MPSMultiUser},
			[]string{"--env-for", "7", "-d", gpu, "-n", "8", "--exclusive", "--spread", "--partition-sm-count", "--mps-multi-user"}},
		{"latency-critical", Share{Holder: 7, GPU: gpu, TPCs: 16, Role: RoleLatencyCritical, MPS: MPSOff},
			[]string{"--env-for", "7", "-d", gpu, "-n", "16", "--latency-critical", "--no-mps"}},
		{"best-effort", Share{Holder: 7, GPU: gpu, TPCs: 4, Role: RoleBestEffort},
			[]string{"--env-for", "7", "-d", gpu, "-n", "4", "--best-effort", "--no-mps"}},
		{"an adopted share's exact list", Share{Holder: 9, GPU: gpu, TPCs: 16, List: "0-15"},
			[]string{"--env-for", "9", "-d", gpu, "-t", "0-15", "--exclusive", "--no-mps"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := tc.share.Args(); !reflect.DeepEqual(got, tc.want) {
				t.Fatalf("Args() = %q, want %q", got, tc.want)
			}
		})
	}
}

func TestReason(t *testing.T) {
	for _, tc := range []struct{ stderr, want string }{
		{"nvtaskset: -n 70 --exclusive: only 48 of 64 TPCs of device 0 are free\n", "-n 70 --exclusive: only 48 of 64 TPCs of device 0 are free"},
		{"[warn] something\nnvtaskset: the real reason\n", "the real reason"},
		{"segfault somewhere\n", "segfault somewhere"},
		{"", "nvtaskset exited with status 3"},
	} {
		if got := reason(tc.stderr, 3); got != tc.want {
			t.Errorf("reason(%q) = %q, want %q", tc.stderr, got, tc.want)
		}
	}
}

func TestParseMPSMode(t *testing.T) {
	for _, ok := range []string{"off", "multi-user"} {
		if _, err := ParseMPSMode(ok); err != nil {
			t.Errorf("ParseMPSMode(%q): %v", ok, err)
		}
	}
	for _, bad := range []string{"", "on", "single-user"} {
		if _, err := ParseMPSMode(bad); err == nil {
			t.Errorf("ParseMPSMode(%q) accepted", bad)
		}
	}
}

func TestParseTopology(t *testing.T) {
	out := []byte(`{"schema": 1, "devices": [{"device": {"index": 1, "name": "NVIDIA H100 80GB HBM3",
	  "uuid": "GPU-1", "pci_bus_id": "0000:19:00.0", "compute_capability": "9.0", "sm_count": 132,
	  "driver_version": 13000, "driver_release": "580.95.05"},
	  "tpcs": [{"tpc": 0}, {"tpc": 1}, {"tpc": 2}], "gpcs": [{"gpc": 0}, {"gpc": 1}]}]}`)
	got, err := parseTopology(out)
	if err != nil {
		t.Fatal(err)
	}
	want := []GPU{{Index: 1, Name: "NVIDIA H100 80GB HBM3", UUID: "GPU-1", PCIBusID: "0000:19:00.0", ComputeCapability: "9.0",
		SMCount: 132, DriverVersion: 13000, DriverRelease: "580.95.05", TPCs: 3, GPCs: 2}}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("parseTopology = %+v, want %+v", got, want)
	}
	if _, err := parseTopology([]byte("not json")); err == nil {
		t.Fatal("parseTopology accepted a non-JSON answer")
	}
}

func TestParseList(t *testing.T) {
	got, err := ParseList("0-3,8,10-11")
	if want := []int{0, 1, 2, 3, 8, 10, 11}; err != nil || !reflect.DeepEqual(got, want) {
		t.Fatalf("ParseList = %v, %v; want %v", got, err, want)
	}
	for _, bad := range []string{"", "a", "3-1", "1-", "-"} {
		if got, err := ParseList(bad); err == nil {
			t.Errorf("ParseList(%q) = %v", bad, got)
		}
	}
}
