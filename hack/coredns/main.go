// Command coredns is cluster DNS for the local real node and the kind node image: CoreDNS built from its own Go
// module with only the plugins a cluster's DNS needs (kubernetes, bind, cache, errors, health, ready, log, and the
// ones kubeadm's default Corefile names: forward, loop, reload, loadbalance, prometheus), so the build skips the
// cloud SDKs the full distribution links in.
package main

import (
	_ "github.com/coredns/coredns/core/dnsserver"
	"github.com/coredns/coredns/coremain"
	_ "github.com/coredns/coredns/plugin/bind"
	_ "github.com/coredns/coredns/plugin/cache"
	_ "github.com/coredns/coredns/plugin/errors"
	_ "github.com/coredns/coredns/plugin/forward"
	_ "github.com/coredns/coredns/plugin/health"
	_ "github.com/coredns/coredns/plugin/kubernetes"
	_ "github.com/coredns/coredns/plugin/loadbalance"
	_ "github.com/coredns/coredns/plugin/log"
	_ "github.com/coredns/coredns/plugin/loop"
	_ "github.com/coredns/coredns/plugin/metrics"
	_ "github.com/coredns/coredns/plugin/ready"
	_ "github.com/coredns/coredns/plugin/reload"
)

func main() {
	coremain.Run()
}
