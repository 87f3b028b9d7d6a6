// SPDX-License-Identifier: Apache-2.0

package driver

import (
	"strings"

	resourceapi "k8s.io/api/resource/v1"

	"nvtaskset.dev/k8s/internal/config"
)

// requestConfigs is the opaque configuration of this driver in an
// allocation, in the order the API gives it (the class's first, then the
// claim's), each with the requests it applies to (none: all).
type requestConfigs []struct {
	requests []string
	cfg      config.Config
}

// configs decodes every opaque configuration for this driver; one that
// does not decode fails the claim.
func configs(in []resourceapi.DeviceAllocationConfiguration) (requestConfigs, error) {
	var out requestConfigs
	for _, c := range in {
		if c.Opaque == nil || c.Opaque.Driver != Name {
			continue
		}
		cfg, err := config.Decode(c.Opaque.Parameters.Raw)
		if err != nil {
			return nil, err
		}
		out = append(out, struct {
			requests []string
			cfg      config.Config
		}{c.Requests, cfg})
	}
	return out, nil
}

// For is the configuration of one request ("req" or "req/subrequest"): a
// configuration naming the request or its parent applies, later ones over
// earlier ones.
func (rc requestConfigs) For(request string) config.Config {
	parent, _, _ := strings.Cut(request, "/")
	var cfg config.Config
	for _, c := range rc {
		applies := len(c.requests) == 0
		for _, r := range c.requests {
			if r == request || r == parent {
				applies = true
			}
		}
		if applies {
			cfg = cfg.Merge(c.cfg)
		}
	}
	return cfg
}
