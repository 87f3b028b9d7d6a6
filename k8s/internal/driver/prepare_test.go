// SPDX-License-Identifier: Apache-2.0

//go:build integration

package driver

import (
	"path/filepath"
	"reflect"
	"strings"
	"syscall"
	"testing"
	"time"

	resourceapi "k8s.io/api/resource/v1"

	"nvtaskset.dev/k8s/internal/cdispec"
	"nvtaskset.dev/k8s/internal/checkpoint"
	"nvtaskset.dev/k8s/internal/holder"
	"nvtaskset.dev/k8s/internal/nvtaskset"
)

// holderTask is the status row of a share's holder.
func holderTask(t *testing.T, tasks []nvtaskset.Task, claim string) nvtaskset.Task {
	t.Helper()
	var found []nvtaskset.Task
	for _, x := range tasks {
		if strings.HasPrefix(x.Command, Name+":") && strings.Contains(x.Command, "claim default/"+claim) {
			found = append(found, x)
		}
	}
	if len(found) != 1 {
		t.Fatalf("status rows of claim %s: %+v (all: %+v)", claim, found, tasks)
	}
	return found[0]
}

func holders(n *node) []holder.Process { return holder.Running(filepath.Join(n.dir, "state")) }

// The whole path of two pods' claims: the scheduler's allocator over the
// published slices, the kubelet's registration and Prepare calls, the CDI
// specs, the program run with each share's edits on its planned TPCs,
// disjoint shares, a restart that adopts them, and Unprepare releasing.
func TestTwoSharesOnOneGPU(t *testing.T) {
	n := newNode(t, 64)
	n.start()
	endpoint := n.register()
	a := newAllocator(t, n.slices(), deviceClass(t))
	if got := a.Slices[0].Spec.Devices[0]; got.Name != "gpu-0" || *got.Attributes["uuid"].StringValue != n.gpus[0].UUID ||
		*got.Attributes["tpcCount"].IntValue != 64 || !*got.AllowMultipleAllocations {
		t.Fatalf("published device %+v", got)
	}
	c16, c32 := newClaim("a", 16), newClaim("b", 32)
	if !a.allocate(c16, "pod-a") || !a.allocate(c32, "pod-b") {
		t.Fatal("not allocated")
	}
	resp := n.prepare(endpoint, c16, c32)
	ids := map[string][]string{}
	for _, c := range []*resourceapi.ResourceClaim{c16, c32} {
		r := resp[string(c.UID)]
		if r == nil || r.Error != "" || len(r.Devices) != 1 {
			t.Fatalf("prepare %s: %+v", c.Name, r)
		}
		dev := r.Devices[0]
		share := string(*c.Status.Allocation.Devices.Results[0].ShareID)
		want := []string{cdispec.QualifiedName(share), "nvidia.com/gpu=" + n.gpus[0].UUID}
		if dev.PoolName != testNode || dev.DeviceName != "gpu-0" || dev.GetShareId() != share || !reflect.DeepEqual(dev.CdiDeviceIds, want) {
			t.Fatalf("prepare %s: device %+v, want CDI IDs %v", c.Name, dev, want)
		}
		ids[c.Name] = dev.CdiDeviceIds
	}
	// --status: each share held on its own TPCs, named by its pod and claim.
	st := n.status()
	ta, tb := holderTask(t, st, "a"), holderTask(t, st, "b")
	if !strings.Contains(ta.Command, "pod default/pod-a claim default/a") {
		t.Fatalf("status command %q does not name the pod and claim", ta.Command)
	}
	la, lb := tpcs(t, ta.TPCs), tpcs(t, tb.TPCs)
	if len(la) != 16 || len(lb) != 32 {
		t.Fatalf("shares of %d and %d TPCs, want 16 and 32 (%q, %q)", len(la), len(lb), ta.TPCs, tb.TPCs)
	}
	for _, k := range la {
		for _, j := range lb {
			if k == j {
				t.Fatalf("shares overlap on TPC %d: %q and %q", k, ta.TPCs, tb.TPCs)
			}
		}
	}
	// The program run with each share's CDI edits runs on exactly its TPCs.
	if got := n.run(ids["a"]...); !reflect.DeepEqual(got, la) {
		t.Fatalf("claim a's program ran on TPCs %v, want %v", got, la)
	}
	if got := n.run(ids["b"]...); !reflect.DeepEqual(got, lb) {
		t.Fatalf("claim b's program ran on TPCs %v, want %v", got, lb)
	}

	// A restart adopts both: the same holders, and a repeated Prepare (the
	// kubelet's after its own restart) answers the same, claiming nothing.
	before := holders(n)
	n.restart()
	endpoint = n.register()
	if after := holders(n); !reflect.DeepEqual(after, before) {
		t.Fatalf("holders %v after the restart, %v before", after, before)
	}
	again := n.prepare(endpoint, c16)
	if r := again[string(c16.UID)]; r.Error != "" || !reflect.DeepEqual(r.Devices[0].CdiDeviceIds, ids["a"]) {
		t.Fatalf("prepare again after the restart: %+v", r)
	}
	if after := holders(n); len(after) != 2 {
		t.Fatalf("%d holders after a repeated Prepare, want 2", len(after))
	}

	// A holder killed with the plugin's container: the next plugin claims
	// the share again on exactly its TPCs.
	b := holderTask(t, n.status(), "b")
	if err := syscall.Kill(b.PID, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	waitGone(t, b.PID)
	n.restart()
	endpoint = n.register()
	nb := holderTask(t, n.status(), "b")
	if nb.PID == b.PID || nb.TPCs != tb.TPCs {
		t.Fatalf("after its holder died, claim b is held by %d on %q (was %d on %q)", nb.PID, nb.TPCs, b.PID, tb.TPCs)
	}

	// Unprepare releases: no holder, no status row, no spec, no checkpoint
	// entry; and again is harmless.
	for i := 0; i < 2; i++ {
		for uid, r := range n.unprepare(endpoint, c16, c32) {
			if r.Error != "" {
				t.Fatalf("unprepare %s: %s", uid, r.Error)
			}
		}
	}
	if h := holders(n); len(h) != 0 {
		t.Fatalf("holders left after Unprepare: %v", h)
	}
	for _, x := range n.status() {
		if strings.HasPrefix(x.Command, Name+":") {
			t.Fatalf("status still lists %+v", x)
		}
	}
	if left, _ := filepath.Glob(filepath.Join(n.cdiDir, "*")); len(left) != 0 {
		t.Fatalf("CDI specs left: %v", left)
	}
	s, err := checkpoint.Load(filepath.Join(n.dir, "state", "checkpoint.json"))
	if err != nil || len(s.Claims) != 0 {
		t.Fatalf("checkpoint after Unprepare: %+v, %v", s, err)
	}
	// Released TPCs can be had again: the whole GPU.
	a.Release(c16)
	a.Release(c32)
	whole := newClaim("whole", 64)
	if !a.allocate(whole, "pod-w") {
		t.Fatal("64 TPCs not allocated after the release")
	}
	if r := n.prepare(endpoint, whole)[string(whole.UID)]; r.Error != "" {
		t.Fatalf("the whole GPU after the release: %s", r.Error)
	}
}

// waitGone waits until pid has exited (and been reaped).
func waitGone(t *testing.T, pid int) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		if _, err := holder.StartTime(pid); err != nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("pid %d still runs", pid)
		}
		time.Sleep(5 * time.Millisecond)
	}
}
