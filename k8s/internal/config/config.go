// SPDX-License-Identifier: Apache-2.0

// Package config decodes a claim's opaque device configuration for
// tpc.nvtaskset.dev: the CLI's role and placement options, per claim.
//
//	config:
//	- opaque:
//	    driver: tpc.nvtaskset.dev
//	    parameters:
//	      apiVersion: tpc.nvtaskset.dev/v1alpha1
//	      kind: TpcConfig
//	      role: latency-critical     # or best-effort; none: exclusive
//	      mode: packed               # or spread
//	      partitionSmCount: true
package config

import (
	"errors"
	"fmt"
	"strings"

	kjson "sigs.k8s.io/json"

	"nvtaskset.dev/k8s/internal/nvtaskset"
)

// APIVersion and Kind name the parameters' schema.
const (
	APIVersion = "tpc.nvtaskset.dev/v1alpha1"
	Kind       = "TpcConfig"
)

// Mode is how the TPCs are placed over the GPCs (nvtaskset -n's packing).
type Mode string

const (
	Packed Mode = "packed" // whole GPCs first (nvtaskset -n)
	Spread Mode = "spread" // evenly over the GPCs (nvtaskset -n --spread)
)

// Config is a share's options. The zero value is the default: exclusive,
// packed, the device's own SM count.
type Config struct {
	APIVersion       string         `json:"apiVersion"`
	Kind             string         `json:"kind"`
	Role             nvtaskset.Role `json:"role,omitempty"`
	Mode             Mode           `json:"mode,omitempty"`
	PartitionSMCount bool           `json:"partitionSmCount,omitempty"`
}

// Decode parses one opaque configuration strictly: unknown fields and
// unknown values are errors, never ignored.
func Decode(raw []byte) (Config, error) {
	var c Config
	// Kubernetes' own decoder: field names match case-sensitively (a
	// misspelt "partitionSMCount" is an unknown field, not an alias), and
	// unknown or repeated fields are errors.
	strict, err := kjson.UnmarshalStrict(raw, &c, kjson.DisallowUnknownFields, kjson.DisallowDuplicateFields)
	if err == nil && len(strict) > 0 {
		err = errors.Join(strict...)
	}
	if err != nil {
		return Config{}, fmt.Errorf("opaque config: %s", oneLine(err.Error()))
	}
	if c.APIVersion != APIVersion || c.Kind != Kind {
		return Config{}, fmt.Errorf("opaque config: apiVersion %q kind %q, want %q %q", c.APIVersion, c.Kind, APIVersion, Kind)
	}
	switch c.Role {
	case nvtaskset.RoleNone, nvtaskset.RoleLatencyCritical, nvtaskset.RoleBestEffort:
	default:
		return Config{}, fmt.Errorf("opaque config: unknown role %q (latency-critical or best-effort)", c.Role)
	}
	switch c.Mode {
	case "", Packed, Spread:
	default:
		return Config{}, fmt.Errorf("opaque config: unknown mode %q (packed or spread)", c.Mode)
	}
	return c, nil
}

// Merge lays the fields that over sets on top of c: a claim's own
// configuration after its class's.
func (c Config) Merge(over Config) Config {
	if over.Role != "" {
		c.Role = over.Role
	}
	if over.Mode != "" {
		c.Mode = over.Mode
	}
	if over.PartitionSMCount {
		c.PartitionSMCount = true
	}
	return c
}

func oneLine(s string) string { return strings.Join(strings.Fields(s), " ") }
