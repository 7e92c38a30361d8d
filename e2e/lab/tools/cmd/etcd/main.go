// Command etcd is the etcd server, built from the go.etcd.io/etcd/server/v3 module pinned in go.mod.
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() {
	etcdmain.Main(os.Args)
}
