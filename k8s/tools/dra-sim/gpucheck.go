// SPDX-License-Identifier: Apache-2.0

package main

import (
	"bufio"
	"context"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"nvtaskset.dev/k8s/internal/kubeletsim"
	"nvtaskset.dev/k8s/internal/nvtaskset"
)

// gpucheck: two shares of 16 and 32 TPCs prepared as the kubelet asks,
// and smid_probe run with each share's CDI edits, both at once. Outside
// MPS the probes' %smid must show exactly each share's TPCs, disjoint;
// under the multi-user MPS server (renumbered %smid) the probes of two
// users must run at the same time, each on its share's SM count.
func gpucheck(args []string) error {
	fs := flag.NewFlagSet("gpucheck", flag.ExitOnError)
	cliPath := fs.String("nvtaskset", "nvtaskset", "the nvtaskset binary (its shim at ../lib/nvtaskset)")
	probe := fs.String("probe", "smid_probe", "tests/gpu/smid_probe.cu, built")
	mpsFlag := fs.String("mps", "off", "off or multi-user")
	users := fs.String("users", "", "two UIDs to run the two probes as (default: this user)")
	iters := fs.Int("iters", 40, "kernels per probe")
	_ = fs.Parse(args)
	mps, err := nvtaskset.ParseMPSMode(*mpsFlag)
	if err != nil {
		return err
	}
	var uids []int
	for _, f := range strings.Split(*users, ",") {
		if f == "" {
			continue
		}
		u, err := strconv.Atoi(f)
		if err != nil {
			return fmt.Errorf("--users: %q", f)
		}
		uids = append(uids, u)
	}
	if len(uids) != 0 && len(uids) != 2 {
		return fmt.Errorf("--users takes two UIDs")
	}
	ctx := context.Background()
	// nvtaskset, its shim and the probe where every user may read them.
	pub, err := os.MkdirTemp("", "dra-gpucheck-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(pub)
	os.Chmod(pub, 0o755)
	cli := filepath.Join(pub, "bin", "nvtaskset")
	for from, to := range map[string]string{
		*cliPath: cli,
		filepath.Join(filepath.Dir(*cliPath), "..", "lib", "nvtaskset", "libcuda.so.1"): filepath.Join(pub, "lib", "nvtaskset", "libcuda.so.1"),
		*probe: filepath.Join(pub, "probe"),
	} {
		b, err := os.ReadFile(from)
		if err == nil {
			if err = os.MkdirAll(filepath.Dir(to), 0o755); err == nil {
				err = os.WriteFile(to, b, 0o755)
			}
		}
		if err != nil {
			return err
		}
	}
	pipeDir := envOr("CUDA_MPS_PIPE_DIRECTORY", "/tmp/nvidia-mps")
	s, err := start(ctx, cli, mps, pipeDir)
	if err != nil {
		return err
	}
	defer s.stop()
	failures, passes := 0, 0
	check := func(ok bool, format string, a ...any) {
		if ok {
			passes++
			fmt.Printf("PASS "+format+"\n", a...)
		} else {
			failures++
			fmt.Printf("FAIL "+format+"\n", a...)
		}
	}
	sizes := []int64{16, 32}
	type share struct {
		tpcs  int64
		ids   []string
		list  []int
		env   []string
		out   []int // TPCs (or, under MPS, virtual TPCs) the probe saw
		sms   map[int]bool
		t0    time.Time
		t1    time.Time
		err   error
		lines int
	}
	shares := make([]*share, len(sizes))
	for i, n := range sizes {
		c, err := s.claim(ctx, n)
		if err != nil {
			return err
		}
		ids, err := s.prepare(ctx, c)
		check(err == nil, "Prepare of a claim for %d TPCs: %v (%v)", n, ids, err)
		if err != nil {
			return fmt.Errorf("%d failures", failures)
		}
		spec, err := kubeletsim.Edits([]string{s.cdiDir, "/etc/cdi", "/var/run/cdi"}, ids...)
		if err != nil {
			return err
		}
		shares[i] = &share{tpcs: n, ids: ids, env: spec.Process.Env, sms: map[int]bool{}}
	}
	tasks, err := s.cli.Status(ctx)
	if err != nil {
		return err
	}
	for _, sh := range shares {
		for _, t := range tasks {
			if strings.HasPrefix(t.Command, "tpc.nvtaskset.dev:") && strings.Count(t.TPCs, "") > 0 {
				if l := expand(strings.Fields(t.TPCs + " ")[0]); int64(len(l)) == sh.tpcs && sh.list == nil {
					sh.list = l
					break
				}
			}
		}
		check(sh.list != nil, "--status lists the %d-TPC share: %v", sh.tpcs, sh.list)
	}
	// Both probes at once.
	var wg sync.WaitGroup
	for i, sh := range shares {
		wg.Add(1)
		go func(i int, sh *share) {
			defer wg.Done()
			cmd := exec.Command(filepath.Join(pub, "probe"), "--iters", strconv.Itoa(*iters), "--interval-ms", "20")
			cmd.Env = sh.env
			if len(uids) == 2 {
				cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uint32(uids[i]), Gid: uint32(uids[i])}}
			}
			out, err := cmd.StdoutPipe()
			if err != nil {
				sh.err = err
				return
			}
			var stderr strings.Builder
			cmd.Stderr = &stderr
			sh.t0 = time.Now()
			if err := cmd.Start(); err != nil {
				sh.err = err
				return
			}
			seen := map[int]bool{}
			sc := bufio.NewScanner(out)
			for sc.Scan() {
				// "iter <i> sms <count> tpcs <list>" a kernel; the
				// header line names the device's own SM count.
				f := strings.Fields(sc.Text())
				if len(f) == 0 || f[0] != "iter" {
					continue
				}
				for j := 0; j+1 < len(f); j++ {
					if f[j] == "tpcs" {
						for _, k := range expand(f[j+1]) {
							seen[k] = true
						}
						sh.lines++
					}
					if f[j] == "sms" {
						if v, err := strconv.Atoi(f[j+1]); err == nil {
							sh.sms[v] = true
						}
					}
				}
			}
			if err := cmd.Wait(); err != nil {
				sh.err = fmt.Errorf("%v: %s", err, strings.TrimSpace(stderr.String()))
			}
			sh.t1 = time.Now()
			for k := range seen {
				sh.out = append(sh.out, k)
			}
			sort.Ints(sh.out)
		}(i, sh)
	}
	wg.Wait()
	who := func(i int) string {
		if len(uids) == 2 {
			return "uid " + strconv.Itoa(uids[i])
		}
		return "uid " + strconv.Itoa(os.Getuid())
	}
	for i, sh := range shares {
		check(sh.err == nil && sh.lines == *iters, "the %d-TPC share's probe (%s) ran %d kernels (%v)", sh.tpcs, who(i), sh.lines, sh.err)
		if mps == nvtaskset.MPSOff {
			check(equal(sh.out, sh.list), "its kernels ran on exactly the share's TPCs by %%smid: %v (share %v)", compact(sh.out), compact(sh.list))
		} else {
			virtual := make([]int, sh.tpcs)
			for k := range virtual {
				virtual[k] = k
			}
			check(len(sh.sms) == 1 && sh.sms[int(2*sh.tpcs)] && equal(sh.out, virtual),
				"under MPS every kernel ran on the share's %d SMs (%%smid renumbered to TPCs 0-%d): SM counts %v, TPCs %s",
				2*sh.tpcs, sh.tpcs-1, keys(sh.sms), compact(sh.out))
		}
	}
	if mps == nvtaskset.MPSOff {
		check(disjoint(shares[0].out, shares[1].out), "the two shares' kernels ran on disjoint TPCs")
	}
	overlap := shares[0].t0.Before(shares[1].t1) && shares[1].t0.Before(shares[0].t1)
	ov := minT(shares[0].t1, shares[1].t1).Sub(maxT(shares[0].t0, shares[1].t0))
	check(overlap && ov > 200*time.Millisecond, "the two probes (%s, %s) ran at the same time: %v overlapping (%v and %v long)", who(0), who(1),
		ov.Round(time.Millisecond), shares[0].t1.Sub(shares[0].t0).Round(time.Millisecond), shares[1].t1.Sub(shares[1].t0).Round(time.Millisecond))
	// Unprepare releases both.
	for _, c := range s.sched.Claims() {
		err := s.unprepare(ctx, c)
		check(err == nil, "Unprepare %s: %v", c.Name, err)
	}
	tasks, _ = s.cli.Status(ctx)
	left := 0
	for _, t := range tasks {
		if strings.HasPrefix(t.Command, "tpc.nvtaskset.dev:") {
			left++
		}
	}
	check(left == 0, "no share left in --status after Unprepare (%d)", left)
	fmt.Printf("%d passed, %d failed\n", passes, failures)
	if failures > 0 {
		return fmt.Errorf("%d failures", failures)
	}
	return nil
}

// expand is a TPC list's TPCs; nothing for one that does not parse.
func expand(list string) []int {
	out, _ := nvtaskset.ParseList(list)
	return out
}

func equal(a, b []int) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

func disjoint(a, b []int) bool {
	m := map[int]bool{}
	for _, k := range a {
		m[k] = true
	}
	for _, k := range b {
		if m[k] {
			return false
		}
	}
	return len(a) > 0 && len(b) > 0
}

func compact(a []int) string {
	var parts []string
	for i := 0; i < len(a); {
		j := i
		for j+1 < len(a) && a[j+1] == a[j]+1 {
			j++
		}
		if i == j {
			parts = append(parts, strconv.Itoa(a[i]))
		} else {
			parts = append(parts, fmt.Sprintf("%d-%d", a[i], a[j]))
		}
		i = j + 1
	}
	return strings.Join(parts, ",")
}

func keys(m map[int]bool) []int {
	var out []int
	for k := range m {
		out = append(out, k)
	}
	sort.Ints(out)
	return out
}

func minT(a, b time.Time) time.Time {
	if a.Before(b) {
		return a
	}
	return b
}

func maxT(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}
