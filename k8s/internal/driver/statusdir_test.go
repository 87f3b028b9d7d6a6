// SPDX-License-Identifier: Apache-2.0

package driver

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// The status directory must be writable by every pod's user (Tier B found a
// 0755 one: the role pods' tasks ran without their beacons).
func TestCheckStatusDir(t *testing.T) {
	base := t.TempDir()
	mk := func(name string, mode os.FileMode) string {
		p := filepath.Join(base, name)
		if err := os.Mkdir(p, 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(p, mode); err != nil {
			t.Fatal(err)
		}
		return p
	}
	file := filepath.Join(base, "file")
	if err := os.WriteFile(file, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name, dir, want string // want: "" for accepted, else part of the error
	}{
		{"1777, as /dev/shm", mk("shm", 0o777|os.ModeSticky), ""},
		{"0755: others cannot write", mk("owner-only", 0o755), "mode 0755"},
		{"0777 without the sticky bit", mk("no-sticky", 0o777), "mode 0777"},
		{"1755: sticky, others cannot write", mk("sticky-only", 0o755|os.ModeSticky), "mode 1755"},
		{"missing", filepath.Join(base, "nope"), "no such file"},
		{"a file", file, "not a directory"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := CheckStatusDir(tc.dir)
			switch {
			case tc.want == "" && err != nil:
				t.Fatalf("CheckStatusDir(%s) = %v, want nil", tc.dir, err)
			case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
				t.Fatalf("CheckStatusDir(%s) = %v, want an error with %q", tc.dir, err, tc.want)
			case err != nil && strings.Contains(err.Error(), "\n"):
				t.Fatalf("the error is not one line: %q", err)
			}
		})
	}
}
