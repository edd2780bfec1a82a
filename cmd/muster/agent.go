package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"strings"
	"time"

	"github.com/musterhq/muster/internal/agent"
	"github.com/musterhq/muster/internal/cli"
	"github.com/musterhq/muster/resolver"
)

const agentReadyzUsage = "usage: muster agent readyz [--http-addr 127.0.0.1:15011]"

const agentUsage = "usage: muster agent --upstream URL[,URL...] (--token-file FILE | --cert FILE --key FILE) [--service S,...] [--ca FILE] [--view-keys FILE,...] [--cache DIR] [--xds-addr 127.0.0.1:15010] [--http-addr 127.0.0.1:15011] [--dns-addr 127.0.0.1:15053 [--dns-zone Z]] [--regions R,...] [--max-services 256] [--max-streams 1000]"

// cmdAgent runs muster agent: it holds one workload's identity and
// serves that workload's data planes, without credentials, on loopback
// or a Unix socket (docs/agent.md).
func cmdAgent(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	if len(args) > 0 && args[0] == "readyz" {
		return cmdAgentReadyz(ctx, args[1:], stdout, stderr)
	}
	var (
		upstream, services, tokenFile, certFile, keyFile, caFile, viewKeys string
		cacheDir, xdsAddr, httpAddr, dnsAddr, dnsZone, region, regions     string
		maxServices, maxStreams                                            int
	)
	fs := cli.NewFlags("agent", stderr)
	fs.StringVar(&upstream, "upstream", os.Getenv("MUSTER_AGENT_UPSTREAM"), "muster's base URLs, comma-separated: the replicas or the load balancer, tried in turn (MUSTER_AGENT_UPSTREAM)")
	fs.StringVar(&services, "service", os.Getenv("MUSTER_AGENT_SERVICES"), "services to follow from the start, comma-separated; local clients add more (MUSTER_AGENT_SERVICES)")
	fs.StringVar(&tokenFile, "token-file", os.Getenv("MUSTER_AGENT_TOKEN_FILE"), "the workload's muster token, re-read on every request to muster (a projected service-account token) (MUSTER_AGENT_TOKEN_FILE)")
	fs.StringVar(&certFile, "cert", os.Getenv("MUSTER_AGENT_CERT_FILE"), "the workload's client certificate (a SPIFFE SVID), with --key; reloaded when the files change (MUSTER_AGENT_CERT_FILE)")
	fs.StringVar(&keyFile, "key", os.Getenv("MUSTER_AGENT_KEY_FILE"), "private key of --cert (MUSTER_AGENT_KEY_FILE)")
	fs.StringVar(&caFile, "ca", os.Getenv("MUSTER_AGENT_CA_FILE"), "PEM CA bundle muster's certificate is verified with (default the system roots) (MUSTER_AGENT_CA_FILE)")
	fs.StringVar(&viewKeys, "view-keys", os.Getenv("MUSTER_AUDIT_PUBLIC_KEY_FILES"), "the region's public key files, comma-separated: only views signed by one are taken (MUSTER_AUDIT_PUBLIC_KEY_FILES)")
	fs.StringVar(&cacheDir, "cache", envOr("MUSTER_AGENT_CACHE", "/var/cache/muster-agent"), "last-known-good views, served at once after a restart with muster down (MUSTER_AGENT_CACHE)")
	fs.StringVar(&xdsAddr, "xds-addr", envOr("MUSTER_AGENT_XDS_ADDR", "127.0.0.1:15010"), "xDS for local clients: a loopback HOST:PORT or unix:/path; \"\" turns it off (MUSTER_AGENT_XDS_ADDR)")
	fs.StringVar(&httpAddr, "http-addr", envOr("MUSTER_AGENT_HTTP_ADDR", "127.0.0.1:15011"), "/v1/watch, /v1/resolve, /readyz and /metrics: a loopback HOST:PORT or unix:/path (MUSTER_AGENT_HTTP_ADDR)")
	fs.StringVar(&dnsAddr, "dns-addr", os.Getenv("MUSTER_AGENT_DNS_ADDR"), "DNS (UDP and TCP) for the services the agent follows, as muster's zone answers them: a loopback HOST:PORT; \"\" (default) turns it off (MUSTER_AGENT_DNS_ADDR)")
	fs.StringVar(&dnsZone, "dns-zone", envOr("MUSTER_AGENT_DNS_ZONE", "muster.internal."), "the zone --dns-addr answers for (MUSTER_AGENT_DNS_ZONE)")
	fs.StringVar(&region, "region", envOr("MUSTER_REGION", "local"), "this region's name: the locality.region of local endpoints when peer regions' take priorities (MUSTER_REGION)")
	fs.StringVar(&regions, "regions", os.Getenv("MUSTER_AGENT_REGIONS"), "peer regions to fall back to, in order of preference, comma-separated, as muster serves them (MUSTER_AGENT_REGIONS)")
	fs.IntVar(&maxServices, "max-services", agent.DefaultMaxServices, "most services local clients can make the agent follow")
	fs.IntVar(&maxStreams, "max-streams", agent.DefaultMaxStreams, "most local streams open at once on each of xDS and the watch stream")
	if err := cli.Parse(fs, args); err != nil {
		return err
	}
	if upstream == "" {
		fmt.Fprintln(stderr, agentUsage)
		return fmt.Errorf("agent: --upstream is required: %w", cli.ErrUsage)
	}
	if tokenFile == "" && certFile == "" {
		fmt.Fprintln(stderr, agentUsage)
		return fmt.Errorf("agent: give the workload's identity, --token-file or --cert and --key: %w", cli.ErrUsage)
	}
	if httpAddr == "" {
		return fmt.Errorf("agent: --http-addr is required (readiness and metrics): %w", cli.ErrUsage)
	}
	// The listeners come first: an address off loopback is refused
	// before anything else is started.
	var listeners []*agent.Listener
	defer func() {
		for _, l := range listeners {
			_ = l.Close()
		}
	}()
	hln, err := agent.Listen(httpAddr)
	if err != nil {
		return fmt.Errorf("agent: --http-addr: %w", err)
	}
	listeners = append(listeners, hln)
	var xln *agent.Listener
	if xdsAddr != "" {
		if xln, err = agent.Listen(xdsAddr); err != nil {
			return fmt.Errorf("agent: --xds-addr: %w", err)
		}
		listeners = append(listeners, xln)
	}

	if dnsAddr != "" {
		if err := agent.CheckLoopback(dnsAddr); err != nil {
			return fmt.Errorf("agent: --dns-addr: %w", err)
		}
	}

	var tokenFn func(context.Context) (string, error)
	if tokenFile != "" {
		if _, err := readToken(tokenFile); err != nil {
			return fmt.Errorf("agent: --token-file: %w", err)
		}
		// Read on every request: a projected token is rewritten in
		// place before it expires, and muster ends a watch stream when
		// the token it was opened with expires.
		tokenFn = func(context.Context) (string, error) { return readToken(tokenFile) }
	}
	getCert, err := clientCertificate(certFile, keyFile)
	if err != nil {
		return fmt.Errorf("agent: %w", err)
	}
	roots, err := caPool(caFile)
	if err != nil {
		return fmt.Errorf("agent: --ca: %w", err)
	}
	cfg := agent.Config{
		Upstream: splitList(upstream), Services: splitList(services), CacheDir: cacheDir,
		Region: region, Regions: splitList(regions),
		Token: tokenFn, RootCAs: roots, GetClientCertificate: getCert, MaxServices: maxServices,
		Logger: slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: slog.LevelInfo})),
	}
	if files := splitList(viewKeys); len(files) > 0 {
		if cfg.ViewKeys, err = resolver.LoadViewKeys(files...); err != nil {
			return fmt.Errorf("agent: --view-keys: %w", err)
		}
	}
	if err := os.MkdirAll(cacheDir, 0o700); err != nil {
		return fmt.Errorf("agent: --cache: %w", err)
	}
	a, err := agent.New(ctx, cfg)
	if err != nil {
		return err
	}
	defer a.Stop()
	srv, err := agent.NewServer(a, agent.ServerConfig{Listeners: listeners, DNSAddr: dnsAddr, DNSZone: dnsZone, MaxStreams: maxStreams, Logger: cfg.Logger})
	if err != nil {
		return err
	}
	if err := a.Start(ctx); err != nil {
		return err
	}
	if err := srv.Start(ctx); err != nil {
		return err
	}
	defer srv.Stop()
	errc := make(chan error, 2)
	if xln != nil {
		go func() { errc <- srv.ServeXDS(xln) }()
	}
	hs := &http.Server{Handler: srv.Handler(), ReadHeaderTimeout: 10 * time.Second}
	go func() {
		if err := hs.Serve(hln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			errc <- err
		}
	}()
	fmt.Fprintf(stdout, "muster agent: xDS on %s, HTTP on %s, DNS on %s, following %s (services %s)\n",
		cmpOr(xdsAddr, "(off)"), httpAddr, cmpOr(dnsAddr, "(off)"), strings.Join(cfg.Upstream, ","), strings.Join(a.Services(), ","))
	var served error
	select {
	case <-ctx.Done():
	case served = <-errc:
	}
	// Shutdown: local clients keep what they hold; the xDS streams end
	// with UNAVAILABLE and the watch streams with a drain frame.
	sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if xln != nil {
		srv.XDS().Drain(sctx)
	}
	a.Stop()
	_ = hs.Shutdown(sctx)
	if served != nil {
		return fmt.Errorf("agent: a local surface stopped: %w", served)
	}
	return nil
}

// readToken reads a token file, trimmed.
func readToken(file string) (string, error) {
	b, err := os.ReadFile(file)
	if err != nil {
		return "", err
	}
	tok := strings.TrimSpace(string(b))
	if tok == "" {
		return "", fmt.Errorf("%s is empty", file)
	}
	return tok, nil
}

// cmdAgentReadyz asks a running agent's /readyz and succeeds only on 200:
// the agent listens on loopback alone, so a kubelet's HTTP probe (sent
// from the node, to the pod's address) cannot reach a sidecar's port; an
// exec probe running this inside the pod can.
func cmdAgentReadyz(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	var httpAddr string
	fs := cli.NewFlags("agent readyz", stderr)
	fs.StringVar(&httpAddr, "http-addr", envOr("MUSTER_AGENT_HTTP_ADDR", "127.0.0.1:15011"), "the agent's --http-addr: a loopback HOST:PORT or unix:/path (MUSTER_AGENT_HTTP_ADDR)")
	if err := cli.Parse(fs, args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		fmt.Fprintln(stderr, agentReadyzUsage)
		return fmt.Errorf("agent readyz: unexpected argument %q: %w", fs.Arg(0), cli.ErrUsage)
	}
	tr := &http.Transport{}
	url := "http://" + httpAddr + "/readyz"
	if path, ok := strings.CutPrefix(httpAddr, "unix:"); ok {
		tr.DialContext = func(ctx context.Context, _, _ string) (net.Conn, error) {
			return (&net.Dialer{}).DialContext(ctx, "unix", path)
		}
		url = "http://agent/readyz"
	}
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return fmt.Errorf("agent readyz: %w", err)
	}
	res, err := (&http.Client{Transport: tr}).Do(req)
	if err != nil {
		return fmt.Errorf("agent readyz: %w", err)
	}
	defer res.Body.Close()
	body, _ := io.ReadAll(io.LimitReader(res.Body, 4096))
	if res.StatusCode != http.StatusOK {
		return fmt.Errorf("agent readyz: %d %s", res.StatusCode, strings.TrimSpace(string(body)))
	}
	_, _ = stdout.Write(body)
	return nil
}
