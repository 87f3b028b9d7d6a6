// SPDX-License-Identifier: Apache-2.0

package config

import (
	"strings"
	"testing"
)

func TestDecode(t *testing.T) {
	const head = `"apiVersion":"tpc.nvtaskset.dev/v1alpha1","kind":"TpcConfig"`
	for _, tc := range []struct {
		name, raw string
		want      Config
		err       string
	}{
		{name: "defaults", raw: `{` + head + `}`, want: Config{APIVersion: APIVersion, Kind: Kind}},
		{name: "every option", raw: `{` + head + `,"role":"latency-critical","mode":"spread","partitionSmCount":true}`,
			want: Config{APIVersion: APIVersion, Kind: Kind, Role: "latency-critical", Mode: Spread, PartitionSMCount: true}},
		{name: "best-effort packed", raw: `{` + head + `,"role":"best-effort","mode":"packed"}`,
			want: Config{APIVersion: APIVersion, Kind: Kind, Role: "best-effort", Mode: Packed}},
		{name: "unknown role", raw: `{` + head + `,"role":"realtime"}`, err: `unknown role "realtime"`},
		{name: "unknown mode", raw: `{` + head + `,"mode":"scattered"}`, err: `unknown mode "scattered"`},
		{name: "unknown field", raw: `{` + head + `,"tpcs":16}`, err: `unknown field "tpcs"`},
		{name: "misspelt field", raw: `{` + head + `,"partitionSMCount":true}`, err: `unknown field "partitionSMCount"`},
		{name: "wrong type", raw: `{` + head + `,"partitionSmCount":"yes"}`, err: "cannot unmarshal"},
		{name: "wrong kind", raw: `{"apiVersion":"tpc.nvtaskset.dev/v1alpha1","kind":"GpuConfig"}`, err: `kind "GpuConfig"`},
		{name: "no apiVersion", raw: `{"kind":"TpcConfig"}`, err: `apiVersion ""`},
		{name: "two values", raw: `{` + head + `}{}`, err: "opaque config"},
		{name: "a field twice", raw: `{` + head + `,"role":"best-effort","role":"latency-critical"}`, err: `duplicate field "role"`},
		{name: "not JSON", raw: `role: latency-critical`, err: "opaque config"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := Decode([]byte(tc.raw))
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("Decode(%s) = %+v, %v; want an error containing %q", tc.raw, got, err, tc.err)
				}
				if strings.Contains(err.Error(), "\n") {
					t.Fatalf("error spans lines: %q", err)
				}
				return
			}
			if err != nil || got != tc.want {
				t.Fatalf("Decode(%s) = %+v, %v; want %+v", tc.raw, got, err, tc.want)
			}
		})
	}
}

func TestMerge(t *testing.T) {
	class := Config{Role: "best-effort", Mode: Spread}
	claim := Config{Role: "latency-critical", PartitionSMCount: true}
	got := class.Merge(claim)
	want := Config{Role: "latency-critical", Mode: Spread, PartitionSMCount: true}
	if got != want {
		t.Fatalf("Merge = %+v, want %+v", got, want)
	}
	if got := want.Merge(Config{}); got != want {
		t.Fatalf("Merge of an empty config changed %+v to %+v", want, got)
	}
}
