// SPDX-License-Identifier: Apache-2.0

// Package checkpoint keeps the plugin's prepared claims on disk, so that a
// restarted plugin adopts them (their holders and CDI specs) instead of
// losing or doubling them, and so that a node reboot is recognised (the
// boot ID changed: every holder is gone).
//
// The file is trusted as OpenSSH trusts its files: a regular file owned by
// this process's user, writable by no one else, of bounded size, or it is
// refused. It is written whole under a temporary name and renamed.
package checkpoint

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"syscall"

	"nvtaskset.dev/k8s/internal/holder"
)

// MaxBytes bounds the file: thousands of claims fit far below it.
const MaxBytes = 8 << 20

const version = 1

// Share is one prepared share of a claim: one allocated device result.
type Share struct {
	Request string         `json:"request"`
	Pool    string         `json:"pool"`
	Device  string         `json:"device"`            // gpu-<index>
	ShareID string         `json:"shareID,omitempty"` // the allocation's share (consumable capacity)
	GPU     string         `json:"gpu"`               // the GPU's UUID
	TPCs    int            `json:"tpcs"`              // the count consumed
	List    string         `json:"list,omitempty"`    // the TPCs nvtaskset chose (logical IDs)
	Role    string         `json:"role,omitempty"`
	Holder  holder.Process `json:"holder"`
	CDIName string         `json:"cdiName"` // the CDI device's name in the claim's spec
	Env     []string       `json:"env"`     // what the CLI printed for the share's tasks
	Spread  bool           `json:"spread,omitempty"`
	SMCount bool           `json:"partitionSmCount,omitempty"`
}

// Claim is one prepared (or being prepared) ResourceClaim.
type Claim struct {
	Namespace string  `json:"namespace"`
	Name      string  `json:"name"`
	Pod       string  `json:"pod,omitempty"` // namespace/name of the pod it was prepared for
	Prepared  bool    `json:"prepared"`      // false: Prepare was under way (its holders are stopped at start)
	Shares    []Share `json:"shares"`
}

// State is the whole checkpoint.
type State struct {
	Version int              `json:"version"`
	BootID  string           `json:"bootID"`
	Claims  map[string]Claim `json:"claims"` // by claim UID
}

// New is an empty state for this boot.
func New() *State { return &State{Version: version, BootID: BootID(), Claims: map[string]Claim{}} }

// BootID is the kernel's ID of this boot.
func BootID() string {
	b, err := os.ReadFile("/proc/sys/kernel/random/boot_id")
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(b))
}

// Load reads path; a missing file is an empty state.
func Load(path string) (*State, error) {
	f, err := os.OpenFile(path, os.O_RDONLY|syscall.O_NOFOLLOW, 0)
	if errors.Is(err, os.ErrNotExist) {
		return New(), nil
	}
	if err != nil {
		return nil, fmt.Errorf("checkpoint %s: %w", path, err)
	}
	defer f.Close()
	if err := trusted(f, path); err != nil {
		return nil, err
	}
	b, err := io.ReadAll(io.LimitReader(f, MaxBytes+1))
	if err != nil {
		return nil, fmt.Errorf("checkpoint %s: %w", path, err)
	}
	if len(b) > MaxBytes {
		return nil, fmt.Errorf("checkpoint %s: larger than %d bytes", path, MaxBytes)
	}
	s := &State{}
	if err := json.Unmarshal(b, s); err != nil {
		return nil, fmt.Errorf("checkpoint %s: %v", path, err)
	}
	if s.Version != version {
		return nil, fmt.Errorf("checkpoint %s: version %d, this plugin reads %d", path, s.Version, version)
	}
	if s.Claims == nil {
		s.Claims = map[string]Claim{}
	}
	return s, nil
}

// trusted refuses a file another user could have written.
func trusted(f *os.File, path string) error {
	fi, err := f.Stat()
	if err != nil {
		return fmt.Errorf("checkpoint %s: %w", path, err)
	}
	if !fi.Mode().IsRegular() {
		return fmt.Errorf("checkpoint %s: not a regular file", path)
	}
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok || int(st.Uid) != os.Geteuid() {
		return fmt.Errorf("checkpoint %s: not owned by uid %d", path, os.Geteuid())
	}
	if fi.Mode().Perm()&0o022 != 0 {
		return fmt.Errorf("checkpoint %s: writable by group or others (mode %#o)", path, fi.Mode().Perm())
	}
	if fi.Size() > MaxBytes {
		return fmt.Errorf("checkpoint %s: larger than %d bytes", path, MaxBytes)
	}
	return nil
}

// Save writes s to path atomically (temporary file, fsync, rename, fsync
// of the directory), mode 0600.
func Save(path string, s *State) error {
	b, err := json.MarshalIndent(s, "", " ")
	if err != nil {
		return err
	}
	if len(b) > MaxBytes {
		return fmt.Errorf("checkpoint %s: would be larger than %d bytes", path, MaxBytes)
	}
	dir := filepath.Dir(path)
	tmp, err := os.CreateTemp(dir, filepath.Base(path)+".tmp*")
	if err != nil {
		return fmt.Errorf("checkpoint: %w", err)
	}
	defer os.Remove(tmp.Name())
	if err := tmp.Chmod(0o600); err == nil {
		if _, err = tmp.Write(b); err == nil {
			err = tmp.Sync()
		}
	}
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("checkpoint: %w", err)
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		return fmt.Errorf("checkpoint: %w", err)
	}
	if d, err := os.Open(dir); err == nil {
		_ = d.Sync()
		d.Close()
	}
	return nil
}
