package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/aws/aws-sdk-go-v2/config"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/musterhq/muster/internal/cli"
	"github.com/musterhq/muster/internal/devissuer"
	"github.com/musterhq/muster/internal/identity"
	"github.com/musterhq/muster/internal/tgsync"
	"github.com/musterhq/muster/resolver"
)

const tgsyncUsage = "usage: muster tgsync --config FILE [--once] [--dry-run] [--json] [--own-group] [--metrics-addr ADDR] [--endpoint-url URL] [--token T] [--data DIR] [--timeout 10s]"

// cmdTgsync runs target-group sync: muster's views, through the resolver
// library and its client guards, kept in ELBv2 target groups and HAProxy
// backends.
func cmdTgsync(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	var (
		cfgFile, metricsAddr, endpointURL, token, dataDir, caFile string
		certFile, keyFile                                         string
		once, dryRun, asJSON, ownGroup                            bool
		timeout                                                   time.Duration
	)
	fs := cli.NewFlags("tgsync", stderr)
	fs.StringVar(&cfgFile, "config", "", "the bindings (YAML or JSON)")
	fs.BoolVar(&once, "once", false, "reconcile once and exit (after waiting up to --timeout for a current view)")
	fs.BoolVar(&dryRun, "dry-run", false, "plan without changing any target group")
	fs.BoolVar(&asJSON, "json", false, "with --once: print the plan as JSON instead of a table")
	fs.BoolVar(&ownGroup, "own-group", false, "every binding owns its group: targets muster did not register are deregistered (capped) instead of left alone")
	fs.StringVar(&metricsAddr, "metrics-addr", "", "serve Prometheus /metrics here (\":9465\" listens on loopback)")
	fs.StringVar(&endpointURL, "endpoint-url", "", "the ELBv2 endpoint (testing; overrides aws.endpoint_url)")
	fs.StringVar(&token, "token", "", "muster bearer token of kind tool (default: muster.token_file, else one minted by the dev issuer in --data)")
	fs.StringVar(&dataDir, "data", ".muster", "dev data folder holding the dev issuer's key")
	fs.StringVar(&caFile, "ca", "", "PEM CA bundle to trust for https muster URLs (default muster.ca_file, else the system roots)")
	fs.StringVar(&certFile, "cert", "", "PEM client certificate for muster URLs that ask for one (mutual TLS), with --key; reloaded when the files change (default muster.cert_file)")
	fs.StringVar(&keyFile, "key", "", "PEM private key of --cert (default muster.key_file)")
	fs.DurationVar(&timeout, "timeout", 10*time.Second, "with --once: how long to wait for a current view before planning from the cache")
	if err := cli.Parse(fs, args); err != nil {
		return err
	}
	if cfgFile == "" {
		fmt.Fprintln(stderr, tgsyncUsage)
		return cli.ErrUsage
	}
	data, err := os.ReadFile(cfgFile)
	if err != nil {
		return fmt.Errorf("read config: %w", err)
	}
	cfg, err := tgsync.ParseConfig(cfgFile, data)
	if err != nil {
		return err
	}
	if endpointURL != "" {
		cfg.AWS.EndpointURL = endpointURL
	}
	for i := range cfg.Bindings {
		cfg.Bindings[i].Policy.OwnGroup = cfg.Bindings[i].Policy.OwnGroup || ownGroup
	}
	log := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: slog.LevelInfo}))

	tokenFn, err := tgsyncToken(token, cfg.Muster.TokenFile, dataDir)
	if err != nil {
		return err
	}
	cacheDir := cfg.Muster.CacheDir
	if cacheDir == "" {
		cacheDir = filepath.Join(dataDir, "tgsync-cache")
	}
	roots, err := caPool(cmpOr(caFile, cfg.Muster.CAFile))
	if err != nil {
		return err
	}
	if certFile == "" && keyFile == "" {
		certFile, keyFile = cfg.Muster.CertFile, cfg.Muster.KeyFile
	}
	getCert, err := clientCertificate(certFile, keyFile)
	if err != nil {
		return err
	}
	client, err := resolver.New(ctx, resolver.Config{
		URLs: cfg.Muster.URLs, Token: tokenFn, Services: cfg.Services(), CacheDir: cacheDir, RootCAs: roots,
		GetClientCertificate: getCert,
		ConfirmAfter:         cfg.Muster.ConfirmAfter, Logger: log.With("component", "resolver"),
		ReportInterval: -1, // tgsync routes no calls: it has no outcomes to report
	})
	if err != nil {
		return err
	}
	defer client.Close()

	bound, err := tgsyncBackends(ctx, cfg)
	if err != nil {
		return err
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	s, err := tgsync.NewSyncer(tgsync.SyncerConfig{
		Source: client, Bindings: bound, Interval: cfg.Interval, DryRun: dryRun, StateDir: cacheDir,
		Logger: log, Registerer: reg,
	})
	if err != nil {
		return err
	}
	if metricsAddr != "" {
		addr, stop, err := serveMetrics(metricsAddr, promhttp.HandlerFor(reg, promhttp.HandlerOpts{}), nil, log)
		if err != nil {
			return err
		}
		defer stop()
		fmt.Fprintf(stdout, "tgsync metrics on http://%s/metrics\n", addr)
	}

	if once {
		waitSynced(ctx, client, timeout, cfg.Services())
		reps := s.RunOnce(ctx)
		printPlans(stdout, reps, asJSON, dryRun)
		var errs []error
		for _, r := range reps {
			if r.Err != nil {
				errs = append(errs, fmt.Errorf("binding %s: %w", r.Binding, r.Err))
			}
		}
		return errors.Join(errs...)
	}
	if err := s.Start(ctx); err != nil {
		return err
	}
	fmt.Fprintf(stdout, "tgsync running: %d bindings, interval %s, dry run %v\n", len(bound), cfg.Interval, dryRun)
	<-ctx.Done()
	s.Stop()
	return nil
}

// tgsyncToken returns where the bearer token comes from: the flag, the
// token file (read again for every subscription, so it can rotate), or a
// tool token minted by the dev issuer.
func tgsyncToken(flagToken, file, dataDir string) (func(context.Context) (string, error), error) {
	switch {
	case flagToken != "":
		return func(context.Context) (string, error) { return flagToken, nil }, nil
	case file != "":
		return func(context.Context) (string, error) {
			b, err := os.ReadFile(file)
			if err != nil {
				return "", fmt.Errorf("read token file: %w", err)
			}
			return strings.TrimSpace(string(b)), nil
		}, nil
	}
	if _, err := os.Stat(filepath.Join(dataDir, "dev-issuer-key.pem")); err != nil {
		return nil, fmt.Errorf("no token: set muster.token_file or --token (no dev issuer in %s)", dataDir)
	}
	iss, err := devissuer.LoadOrCreate(dataDir)
	if err != nil {
		return nil, err
	}
	return func(context.Context) (string, error) {
		return iss.Mint(devissuer.TokenRequest{Kind: identity.KindTool, Subject: "muster-tgsync", TTL: time.Hour}, time.Now())
	}, nil
}

// tgsyncBackends builds each binding's backend; an ELBv2 group is
// checked (it exists, of type ip) before anything runs.
func tgsyncBackends(ctx context.Context, cfg tgsync.Config) ([]tgsync.Bound, error) {
	var out []tgsync.Bound
	var elb tgsync.ELBv2API
	for _, b := range cfg.Bindings {
		if b.HAProxy != nil {
			out = append(out, tgsync.Bound{Binding: b, Backend: tgsync.NewHAProxy(*b.HAProxy)})
			continue
		}
		if elb == nil {
			var opts []func(*config.LoadOptions) error
			if cfg.AWS.Region != "" {
				opts = append(opts, config.WithRegion(cfg.AWS.Region))
			}
			lctx, cancel := context.WithTimeout(ctx, 30*time.Second)
			awsCfg, err := config.LoadDefaultConfig(lctx, opts...)
			cancel()
			if err != nil {
				return nil, fmt.Errorf("AWS configuration: %w", err)
			}
			elb = tgsync.NewELBv2Client(awsCfg, cfg.AWS)
		}
		cctx, cancel := context.WithTimeout(ctx, 60*time.Second)
		be, err := tgsync.NewELBv2(cctx, elb, *b.ELBv2)
		cancel()
		if err != nil {
			return nil, fmt.Errorf("binding %s: %w", b.Name, err)
		}
		// DescribeTargetHealth once per interval, not once per view
		// change: the periodic cycle compares with AWS's state.
		out = append(out, tgsync.Bound{Binding: b, Backend: be, ReadEvery: cfg.Interval})
	}
	return out, nil
}

// planJSON is one binding's entry in --json.
type planJSON struct {
	tgsync.Report
	Hold  *holdJSON `json:"hold"`
	Error string    `json:"error,omitempty"`
}

func printPlans(w io.Writer, reps []tgsync.Report, asJSON, dryRun bool) {
	if asJSON {
		out := make([]planJSON, 0, len(reps))
		for _, r := range reps {
			// Empty lists print as [], not null.
			pl := &r.Plan
			for _, l := range []*[]tgsync.Want{&pl.Register, &pl.Reweight, &pl.DeferredRegister} {
				if *l == nil {
					*l = []tgsync.Want{}
				}
			}
			for _, l := range []*[]tgsync.Have{&pl.Deregister, &pl.DeferredDeregister, &pl.Unmanaged} {
				if *l == nil {
					*l = []tgsync.Have{}
				}
			}
			p := planJSON{Report: r, Hold: newHoldJSON(r.Hold)}
			if r.Err != nil {
				p.Error = r.Err.Error()
			}
			out = append(out, p)
		}
		b, _ := json.MarshalIndent(out, "", "  ")
		fmt.Fprintf(w, "%s\n", b)
		return
	}
	for _, r := range reps {
		mode := "applied"
		if dryRun {
			mode = "dry run: nothing changed"
		} else if !r.Applied {
			mode = "not applied"
		}
		fmt.Fprintf(w, "binding %s (%s %s), service %s, view v%d: desired %d, registered %d (%s)\n",
			r.Binding, r.Kind, r.Target, r.Service, r.Version, r.Desired, r.Registered, mode)
		if r.Err != nil {
			fmt.Fprintf(w, "  error: %v\n", r.Err)
		}
		if r.Hold != nil {
			fmt.Fprintln(w, "  "+holdLine(r.Hold, time.Now()))
		}
		if r.Plan.Held != "" {
			fmt.Fprintln(w, "  held: the view routes to nothing; the group is not emptied")
		}
		p := r.Plan
		if p.Empty() && len(p.DeferredDeregister)+len(p.DeferredRegister)+len(p.Unmanaged) == 0 {
			fmt.Fprintln(w, "  in step: no change")
			continue
		}
		tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "  ACTION\tTARGET\tINSTANCE\tZONE\tWEIGHT\tNOTE")
		for _, x := range p.Register {
			fmt.Fprintf(tw, "  register\t%s\t%s\t%s\t%d\t\n", x.Key, x.InstanceID, x.Zone, x.Weight)
		}
		for _, x := range p.Reweight {
			fmt.Fprintf(tw, "  reweight\t%s\t%s\t%s\t%d\t\n", x.Key, x.InstanceID, x.Zone, x.Weight)
		}
		for _, x := range p.Deregister {
			fmt.Fprintf(tw, "  deregister\t%s\t\t\t\t%s\n", x.Key, x.State)
		}
		for _, x := range p.DeferredRegister {
			fmt.Fprintf(tw, "  register later\t%s\t%s\t%s\t%d\tslow start: next step\n", x.Key, x.InstanceID, x.Zone, x.Weight)
		}
		for _, x := range p.DeferredDeregister {
			note := "capped: next interval"
			if p.Held != "" {
				note = "held: not emptying the group"
			}
			fmt.Fprintf(tw, "  deregister later\t%s\t\t\t\t%s\n", x.Key, note)
		}
		for _, x := range p.Unmanaged {
			fmt.Fprintf(tw, "  leave alone\t%s\t\t\t\tnot muster's (--own-group manages it)\n", x.Key)
		}
		tw.Flush()
	}
}
