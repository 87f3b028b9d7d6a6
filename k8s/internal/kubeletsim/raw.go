// SPDX-License-Identifier: Apache-2.0

package kubeletsim

import "k8s.io/apimachinery/pkg/runtime"

func rawExtension(s string) runtime.RawExtension { return runtime.RawExtension{Raw: []byte(s)} }
