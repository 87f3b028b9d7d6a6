// Command etcd is etcd's own server entry point, built from go.etcd.io/etcd/server/v3 so that the
// one-node test cluster needs no downloaded binary.
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() {
	etcdmain.Main(os.Args)
}
