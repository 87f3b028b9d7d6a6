// SPDX-License-Identifier: Apache-2.0

//go:build integration

package driver

import (
	"os"
	"path/filepath"
	"testing"

	"nvtaskset.dev/k8s/internal/checkpoint"
	"nvtaskset.dev/k8s/internal/holder"
)

// What a plugin finds when it starts: a Prepare it died in the middle of
// (undone: its holder stopped), a holder no claim lists (stopped), and
// claims prepared before the node rebooted (dropped with their specs).
func TestStartCleansUp(t *testing.T) {
	n := newNode(t, 64)
	state := filepath.Join(n.dir, "state")
	exe, _ := os.Executable()
	pending, err := holder.Start(exe, []string{Name + ":", "claim", "default/pending"}, state)
	if err != nil {
		t.Fatal(err)
	}
	orphan, err := holder.Start(exe, []string{Name + ":", "claim", "default/orphan"}, state)
	if err != nil {
		t.Fatal(err)
	}
	// A holder of another plugin instance (another state directory) is
	// never touched.
	other, err := holder.Start(exe, []string{Name + ":", "claim", "default/other"}, filepath.Join(n.dir, "other-state"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = other.Stop(0) })
	s := checkpoint.New()
	s.Claims["uid-pending"] = checkpoint.Claim{Namespace: "default", Name: "pending", Prepared: false,
		Shares: []checkpoint.Share{{Device: "gpu-0", Holder: pending}}}
	if err := checkpoint.Save(filepath.Join(state, "checkpoint.json"), s); err != nil {
		t.Fatal(err)
	}
	n.start()
	for _, p := range []holder.Process{pending, orphan} {
		if p.Alive() {
			t.Fatalf("holder %d still runs after the plugin started", p.PID)
		}
	}
	if !other.Alive() {
		t.Fatal("the plugin stopped another instance's holder")
	}
	got, err := checkpoint.Load(filepath.Join(state, "checkpoint.json"))
	if err != nil || len(got.Claims) != 0 {
		t.Fatalf("checkpoint after start: %+v, %v", got.Claims, err)
	}

	// After a reboot (another boot ID) every claim is gone, and its spec.
	n.d.Stop()
	n.d = nil
	s = checkpoint.New()
	s.BootID = "an-earlier-boot"
	s.Claims["uid-old"] = checkpoint.Claim{Namespace: "default", Name: "old", Prepared: true,
		Shares: []checkpoint.Share{{Device: "gpu-0", List: "0-15", Holder: holder.Process{PID: 1, Start: 1}}}}
	if err := checkpoint.Save(filepath.Join(state, "checkpoint.json"), s); err != nil {
		t.Fatal(err)
	}
	spec := filepath.Join(n.cdiDir, "tpc.nvtaskset.dev-share_uid-old.json")
	if err := os.WriteFile(spec, []byte("{}"), 0o644); err != nil {
		t.Fatal(err)
	}
	n.start()
	if _, err := os.Stat(spec); !os.IsNotExist(err) {
		t.Fatalf("the CDI spec of a claim from before the reboot is still there: %v", err)
	}
	got, _ = checkpoint.Load(filepath.Join(state, "checkpoint.json"))
	if len(got.Claims) != 0 || got.BootID != checkpoint.BootID() {
		t.Fatalf("checkpoint after the reboot: %+v", got)
	}
	if h := holders(n); len(h) != 0 {
		t.Fatalf("holders: %v", h)
	}
}
