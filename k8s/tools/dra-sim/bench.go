// SPDX-License-Identifier: Apache-2.0

package main

import (
	"context"
	"flag"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"time"

	resourceapi "k8s.io/api/resource/v1"

	"nvtaskset.dev/k8s/internal/nvtaskset"
)

// bench: Prepare and Unprepare of one claim of 1 TPC, `claims` times, with
// `live` other shares held on the node meanwhile, for each live count;
// the p99s as ratios to the first count's, side by side.
func bench(args []string) error {
	fs := flag.NewFlagSet("bench", flag.ExitOnError)
	cli := fs.String("nvtaskset", "nvtaskset", "the nvtaskset binary")
	claims := fs.Int("claims", 200, "claims prepared and unprepared per live count")
	lives := fs.String("live", "1,8,32", "shares already live on the node, one run each")
	_ = fs.Parse(args)
	ctx := context.Background()
	s, err := start(ctx, *cli, nvtaskset.MPSOff, "")
	if err != nil {
		return err
	}
	defer s.stop()
	type row struct {
		live                               int
		p50p, p99p, p50u, p99u, maxp, maxu time.Duration
	}
	var rows []row
	var held []*resourceapi.ResourceClaim
	for _, f := range strings.Split(*lives, ",") {
		live, err := strconv.Atoi(f)
		if err != nil || live < 0 {
			return fmt.Errorf("--live: %q", f)
		}
		for len(held) < live {
			c, err := s.claim(ctx, 1)
			if err == nil {
				_, err = s.prepare(ctx, c)
			}
			if err != nil {
				return fmt.Errorf("a live share: %v", err)
			}
			held = append(held, c)
		}
		var prep, unprep []time.Duration
		for i := 0; i < *claims; i++ {
			c, err := s.claim(ctx, 1)
			if err != nil {
				return err
			}
			t0 := time.Now()
			if _, err := s.prepare(ctx, c); err != nil {
				return err
			}
			t1 := time.Now()
			if err := s.unprepare(ctx, c); err != nil {
				return err
			}
			prep, unprep = append(prep, t1.Sub(t0)), append(unprep, time.Since(t1))
		}
		rows = append(rows, row{live, pct(prep, 50), pct(prep, 99), pct(unprep, 50), pct(unprep, 99), pct(prep, 100), pct(unprep, 100)})
	}
	fmt.Printf("Prepare and Unprepare of a 1-TPC claim over the kubelet's gRPC, %d claims per row\n", *claims)
	fmt.Printf("%-6s %10s %10s %10s %12s %12s %12s %10s %10s\n", "live", "prep p50", "prep p99", "prep max",
		"unprep p50", "unprep p99", "unprep max", "p99/first", "p99 < 100ms")
	for _, r := range rows {
		ok := "yes"
		if r.p99p >= 100*time.Millisecond {
			ok = "NO"
		}
		fmt.Printf("%-6d %10s %10s %10s %12s %12s %12s %10.2f %10s\n", r.live, ms(r.p50p), ms(r.p99p), ms(r.maxp),
			ms(r.p50u), ms(r.p99u), ms(r.maxu), float64(r.p99p)/float64(rows[0].p99p), ok)
	}
	return nil
}

func pct(d []time.Duration, p int) time.Duration {
	s := append([]time.Duration(nil), d...)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	i := (len(s)*p + 99) / 100
	if i > 0 {
		i--
	}
	return s[i]
}

func ms(d time.Duration) string { return fmt.Sprintf("%.1f ms", float64(d)/1e6) }
