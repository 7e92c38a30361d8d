// kube-network-policies (SIG Network's NetworkPolicy agent) for the harness's real node (e2e/realnode.py). Our own
// main, for two reasons: upstream's cmd/main.go reads only in-cluster credentials (rest.InClusterConfig), while the
// node's host processes authenticate with a kubeconfig of their own; and on a kernel without nftables' queue
// expression (this machine's) the controller cannot install its nftables table, so --xt-queue-cidr sends new
// connections to pods to the same NFQUEUE with the xtables target (xtQueue below). The decisions are upstream's
// controller's, for plain NetworkPolicies: no AdminNetworkPolicy or BaselineAdminNetworkPolicy (alpha CRDs the
// harness does not install), so no network-policy-api client and no Node informer.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/google/nftables"
	"github.com/google/nftables/binaryutil"
	"github.com/google/nftables/expr"
	"github.com/google/nftables/xt"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	nodeutil "k8s.io/component-helpers/node/util"
	"k8s.io/klog/v2"
	"sigs.k8s.io/kube-network-policies/pkg/networkpolicy"
)

func main() {
	os.Exit(run()) // after run's deferred calls
}

func run() int {
	kubeconfig := flag.String("kubeconfig", "", "kubeconfig with the API server and this agent's client certificate")
	hostname := flag.String("hostname-override", "", "name of the Node this agent serves (default: the hostname)")
	queueID := flag.Int("nfqueue-id", 100, "NFQUEUE that the first packet of each connection is sent to")
	metricsAddr := flag.String("metrics-bind-address", ":9080", "address of /metrics and /readyz")
	disableNRI := flag.Bool("disable-nri", false, "take pod IPs from the API server only, not from the runtime's NRI")
	failOpen := flag.Bool("fail-open", false, "let packets through while no agent reads the queue (default: drop)")
	queueCIDR := flag.String("xt-queue-cidr", "", "queue new connections to this pod range with the xtables NFQUEUE "+
		"target, in a table of our own (for kernels without nftables' queue expression; see xtQueue)")
	klog.InitFlags(nil)
	flag.Parse()
	defer klog.Flush()

	nodeName, err := nodeutil.GetHostname(*hostname)
	if err != nil {
		klog.ErrorS(err, "node name")
		return 1
	}
	config, err := clientcmd.BuildConfigFromFlags("", *kubeconfig)
	if err != nil {
		klog.ErrorS(err, "kubeconfig", "path", *kubeconfig)
		return 1
	}
	// Protobuf for the built-in kinds, as upstream does (no CRDs are read here).
	config.AcceptContentTypes = "application/vnd.kubernetes.protobuf,application/json"
	config.ContentType = "application/vnd.kubernetes.protobuf"
	client, err := kubernetes.NewForConfig(config)
	if err != nil {
		klog.ErrorS(err, "client")
		return 1
	}

	// SIGTERM too (upstream's main stops on SIGINT only): the harness stops its processes with SIGTERM, and the
	// controller deletes its nftables table on the way out, whose NFQUEUE rule would otherwise drop pod traffic.
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()

	factory := informers.NewSharedInformerFactory(client, 0)
	controller, err := networkpolicy.NewController(client,
		factory.Networking().V1().NetworkPolicies(), factory.Core().V1().Namespaces(), factory.Core().V1().Pods(),
		nil, nil, nil, nil, // Node informer, network-policy-api client and informers: admin policies only
		networkpolicy.Config{
			FailOpen:            *failOpen,
			QueueID:             *queueID,
			NodeName:            nodeName,
			NetfilterBug1766Fix: true, // upstream's default: DNS queued on prerouting, after DNAT
			NRIdisabled:         *disableNRI,
		})
	if err != nil {
		klog.ErrorS(err, "network policy controller")
		return 1
	}

	// /readyz answers once the informers have listed pods, namespaces and policies (the controller programs its
	// nftables table right after) and the xtables queue rules are in; bound before anything starts, so that a
	// taken port fails at once.
	listener, err := net.Listen("tcp", *metricsAddr)
	if err != nil {
		klog.ErrorS(err, "metrics listener")
		return 1
	}
	synced := make(chan struct{})
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.Handler())
	mux.HandleFunc("/readyz", func(w http.ResponseWriter, _ *http.Request) {
		select {
		case <-synced:
			_, _ = w.Write([]byte("ok"))
		default:
			http.Error(w, "informers not synced", http.StatusServiceUnavailable)
		}
	})
	go func() { _ = http.Serve(listener, mux) }()

	done := make(chan error, 1)
	go func() { done <- controller.Run(ctx) }()
	factory.Start(ctx.Done())
	for typ, ok := range factory.WaitForCacheSync(ctx.Done()) {
		if !ok && ctx.Err() == nil {
			klog.ErrorS(nil, "informer did not sync", "type", typ)
			return 1
		}
	}
	if *queueCIDR != "" {
		remove, err := xtQueue(*queueCIDR, uint16(*queueID))
		if err != nil {
			klog.ErrorS(err, "xtables queue rules", "cidr", *queueCIDR)
			return 1
		}
		defer remove()
	}
	close(synced)

	select {
	case err := <-done: // Run returns early only when it cannot open the queue
		if err == nil {
			err = errors.New("stopped")
		}
		klog.ErrorS(err, "network policy controller")
		return 1
	case <-ctx.Done():
	}
	// Run's deferred cleanup deletes the nftables table; give it a moment, as upstream's grace period does.
	select {
	case <-done:
	case <-time.After(5 * time.Second):
	}
	return 0
}

// The table xtQueue makes; e2e/realnode.py deletes it too, after a crash.
const xtQueueTable = "pagoda-netpol-queue"

// xtQueue sends the first packet of every connection to a pod in cidr to NFQUEUE queue, where the controller
// decides it, as the controller's own nftables table would. That table cannot be installed on a kernel built
// without nftables' queue expression (CONFIG_NFT_QUEUE unset: its transaction fails with ENOENT, and the
// controller keeps retrying it), while the xtables NFQUEUE target is there through nft_compat. The chain mirrors
// the controller's postrouting chain (v0.8.0 controller.go): after DNAT, before SNAT; the node's own root-owned
// sockets (kubelet probes) and established connections pass; the rest is queued without bypass, so a packet
// nobody decides is dropped. Only traffic to pods is queued (the harness's policies restrict ingress), which
// also keeps the controller from looking up addresses that are no pod's. Returns what deletes the table.
func xtQueue(cidr string, queue uint16) (func(), error) {
	_, network, err := net.ParseCIDR(cidr)
	if err != nil || network.IP.To4() == nil {
		return nil, fmt.Errorf("--xt-queue-cidr: %q is not an IPv4 CIDR", cidr)
	}
	conn, err := nftables.New()
	if err != nil {
		return nil, err
	}
	table := &nftables.Table{Name: xtQueueTable, Family: nftables.TableFamilyIPv4}
	conn.DelTable(table) // a table left by a killed agent; no error when there is none (flushed below)
	_ = conn.Flush()
	conn.AddTable(table)
	chain := conn.AddChain(&nftables.Chain{
		Name:     "postrouting",
		Table:    table,
		Type:     nftables.ChainTypeFilter,
		Hooknum:  nftables.ChainHookPostrouting,
		Priority: nftables.ChainPriorityRef(*nftables.ChainPriorityNATSource - 5),
	})
	accept := &expr.Verdict{Kind: expr.VerdictAccept}
	var info xt.Unknown // struct xt_NFQ_info_v3 in the host's byte order: queue number, queues total, flags
	for _, field := range []uint16{queue, 1, 0} {
		info = append(info, binaryutil.NativeEndian.PutUint16(field)...)
	}
	rules := [][]expr.Any{
		{ // meta skuid 0 accept
			&expr.Meta{Key: expr.MetaKeySKUID, Register: 1},
			&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{0, 0, 0, 0}},
			accept,
		},
		{ // ct state established,related accept
			&expr.Ct{Register: 1, Key: expr.CtKeySTATE},
			&expr.Bitwise{
				SourceRegister: 1,
				DestRegister:   1,
				Len:            4,
				Mask:           binaryutil.NativeEndian.PutUint32(expr.CtStateBitESTABLISHED | expr.CtStateBitRELATED),
				Xor:            []byte{0, 0, 0, 0},
			},
			&expr.Cmp{Op: expr.CmpOpNeq, Register: 1, Data: []byte{0, 0, 0, 0}},
			accept,
		},
		{ // ip daddr CIDR: xtables NFQUEUE, revision 3 (struct xt_NFQ_info_v3: queue, queues total, flags 0)
			&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: 16, Len: 4},
			&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 4, Mask: network.Mask, Xor: []byte{0, 0, 0, 0}},
			&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: network.IP.To4()},
			&expr.Target{Name: "NFQUEUE", Rev: 3, Info: &info},
		},
	}
	for _, exprs := range rules {
		conn.AddRule(&nftables.Rule{Table: table, Chain: chain, Exprs: exprs})
	}
	if err := conn.Flush(); err != nil {
		return nil, err
	}
	klog.InfoS("Queueing new connections to pods with the xtables NFQUEUE target", "cidr", cidr, "queue", queue)
	return func() {
		conn.DelTable(table)
		if err := conn.Flush(); err != nil {
			klog.ErrorS(err, "deleting the xtables queue table")
		}
	}, nil
}
