// Command etcd runs etcd's standard entrypoint, built from the
// go.etcd.io/etcd/server/v3 module for embedjob's test harness (tests/envtest).
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() {
	etcdmain.Main(os.Args)
}
