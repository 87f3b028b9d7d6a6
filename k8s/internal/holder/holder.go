// SPDX-License-Identifier: Apache-2.0

// Package holder runs the long-lived processes that hold claimed shares.
//
// nvtaskset ties a claim to a live process (its status entry names the
// process and its start time; once the process is gone, every reader
// ignores and removes the entry). A holder is that process for one share:
// it lives until Unprepare stops it, in a session of its own, so that it
// outlives a restarted plugin, which adopts it from the checkpoint.
// Its command line names the pod and the claim, which `nvtaskset --status`
// shows in its COMMAND column, as it shows a Slurm step's slurmstepd.
package holder

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// EnvMarker in a process's environment makes the plugin's binary a holder
// (Main); its value is the state directory of the plugin that started it,
// so that a plugin only ever stops its own holders.
const EnvMarker = "NVTASKSET_DRA_HOLDER"

// Process identifies a holder beyond PID reuse.
type Process struct {
	PID   int    `json:"pid"`
	Start uint64 `json:"start"` // /proc/<pid>/stat field 22, clock ticks since boot
}

// Start runs exe as a holder whose argv is label (argv[0] included).
func Start(exe string, label []string, owner string) (Process, error) {
	null, err := os.OpenFile(os.DevNull, os.O_RDWR, 0)
	if err != nil {
		return Process{}, err
	}
	defer null.Close()
	cmd := &exec.Cmd{
		Path:        exe,
		Args:        label,
		Env:         []string{EnvMarker + "=" + owner, "PATH=/usr/sbin:/usr/bin:/sbin:/bin"},
		Stdin:       null,
		Stdout:      null,
		Stderr:      null,
		SysProcAttr: &syscall.SysProcAttr{Setsid: true},
	}
	if err := cmd.Start(); err != nil {
		return Process{}, fmt.Errorf("start holder: %w", err)
	}
	pid := cmd.Process.Pid
	// Reap it whenever it ends, while this plugin lives (after a restart,
	// init reaps the holders the earlier plugin started).
	go func() { _ = cmd.Wait() }()
	start, err := StartTime(pid)
	if err != nil {
		_ = syscall.Kill(pid, syscall.SIGKILL)
		return Process{}, fmt.Errorf("holder %d: %w", pid, err)
	}
	return Process{pid, start}, nil
}

// StartTime reads a process's start time from /proc/<pid>/stat.
func StartTime(pid int) (uint64, error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, err
	}
	// The command name (field 2) may hold spaces and parentheses: fields
	// are counted from the last ')'.
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return 0, errors.New("malformed /proc stat")
	}
	f := strings.Fields(s[i+1:])
	// f[0] is field 3 (state); start time is field 22.
	if len(f) < 20 {
		return 0, errors.New("malformed /proc stat")
	}
	if f[0] == "Z" || f[0] == "X" {
		return 0, errors.New("process has exited")
	}
	return strconv.ParseUint(f[19], 10, 64)
}

// Alive says whether p is still the process it was.
func (p Process) Alive() bool {
	if p.PID <= 0 {
		return false
	}
	start, err := StartTime(p.PID)
	return err == nil && start == p.Start
}

// Stop ends p and waits until it is gone, so that its claim is released
// when Stop returns: TERM, then KILL after grace.
func (p Process) Stop(grace time.Duration) error {
	if !p.Alive() {
		return nil
	}
	_ = syscall.Kill(p.PID, syscall.SIGTERM)
	deadline := time.Now().Add(grace)
	for p.Alive() {
		if time.Now().After(deadline) {
			_ = syscall.Kill(p.PID, syscall.SIGKILL)
			deadline = time.Now().Add(5 * time.Second)
			grace = 0
			for p.Alive() {
				if time.Now().After(deadline) {
					return fmt.Errorf("holder %d did not end after SIGKILL", p.PID)
				}
				time.Sleep(5 * time.Millisecond)
			}
			return nil
		}
		time.Sleep(2 * time.Millisecond)
	}
	return nil
}

// Owner returns the plugin state directory a running process holds shares
// for, if it is a holder (its environment carries EnvMarker).
func Owner(pid int) (string, bool) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/environ")
	if err != nil {
		return "", false
	}
	for _, kv := range strings.Split(string(b), "\x00") {
		if v, ok := strings.CutPrefix(kv, EnvMarker+"="); ok {
			return v, true
		}
	}
	return "", false
}

// Running lists the holders of owner that are alive now.
func Running(owner string) []Process {
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return nil
	}
	var out []Process
	self := os.Getpid()
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == self {
			continue
		}
		if o, ok := Owner(pid); ok && o == owner {
			if start, err := StartTime(pid); err == nil {
				out = append(out, Process{pid, start})
			}
		}
	}
	return out
}

// Main is a holder's whole life: wait for TERM or INT, then exit 0.
func Main() {
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGTERM, syscall.SIGINT, syscall.SIGHUP)
	<-sig
	os.Exit(0)
}

// IsHolder says whether this process was started as a holder.
func IsHolder() bool {
	_, ok := os.LookupEnv(EnvMarker)
	return ok
}
