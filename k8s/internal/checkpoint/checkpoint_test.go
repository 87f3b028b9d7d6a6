// SPDX-License-Identifier: Apache-2.0

package checkpoint

import (
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"nvtaskset.dev/k8s/internal/holder"
)

func TestRoundTrip(t *testing.T) {
	path := filepath.Join(t.TempDir(), "checkpoint.json")
	s := New()
	s.Claims["uid-1"] = Claim{Namespace: "ns", Name: "c", Pod: "ns/p", Prepared: true, Shares: []Share{{
		Request: "gpu", Pool: "node", Device: "gpu-0", ShareID: "share-1", GPU: "GPU-1", TPCs: 16, List: "0-15",
		Holder: holder.Process{PID: 42, Start: 7}, CDIName: "share-1", Env: []string{"A=B"},
	}}}
	if err := Save(path, s); err != nil {
		t.Fatal(err)
	}
	fi, err := os.Stat(path)
	if err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("saved with mode %v (%v), want 0600", fi.Mode(), err)
	}
	got, err := Load(path)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got, s) {
		t.Fatalf("Load = %+v, want %+v", got, s)
	}
	if left, _ := filepath.Glob(path + ".tmp*"); len(left) != 0 {
		t.Fatalf("temporary files left: %v", left)
	}
}

func TestMissingIsEmpty(t *testing.T) {
	s, err := Load(filepath.Join(t.TempDir(), "none.json"))
	if err != nil || len(s.Claims) != 0 || s.BootID != BootID() {
		t.Fatalf("Load(missing) = %+v, %v", s, err)
	}
}

// The file is trusted only as OpenSSH trusts its files.
func TestRefusesUntrustedFiles(t *testing.T) {
	dir := t.TempDir()
	good := filepath.Join(dir, "good.json")
	if err := Save(good, New()); err != nil {
		t.Fatal(err)
	}
	data, _ := os.ReadFile(good)
	write := func(name string, mode os.FileMode, body []byte) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, body, mode); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(p, mode); err != nil {
			t.Fatal(err)
		}
		return p
	}
	link := filepath.Join(dir, "link.json")
	if err := os.Symlink(good, link); err != nil {
		t.Fatal(err)
	}
	sub := filepath.Join(dir, "dir.json")
	if err := os.Mkdir(sub, 0o700); err != nil {
		t.Fatal(err)
	}
	cases := map[string]struct{ path, want string }{
		"group-writable":  {write("g.json", 0o620, data), "writable by group or others"},
		"world-writable":  {write("w.json", 0o602, data), "writable by group or others"},
		"too large":       {write("big.json", 0o600, make([]byte, MaxBytes+1)), "larger than"},
		"a link":          {link, "too many levels of symbolic links"},
		"a directory":     {sub, "not a regular file"},
		"not JSON":        {write("bad.json", 0o600, []byte("{")), "unexpected end"},
		"another version": {write("v.json", 0o600, []byte(`{"version": 99, "claims": {}}`)), "version 99"},
	}
	if os.Geteuid() == 0 {
		p := write("other.json", 0o600, data)
		if err := os.Chown(p, 65534, 65534); err != nil {
			t.Fatal(err)
		}
		cases["another user's"] = struct{ path, want string }{p, "not owned by uid 0"}
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			_, err := Load(tc.path)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Load(%s) = %v, want an error containing %q", tc.path, err, tc.want)
			}
		})
	}
}
