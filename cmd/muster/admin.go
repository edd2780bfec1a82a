package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/musterhq/muster/db"
	"github.com/musterhq/muster/internal/cli"
	"github.com/musterhq/muster/internal/devissuer"
	"github.com/musterhq/muster/internal/identity"
)

// addrList collects repeated --address flags.
type addrList []string

func (a *addrList) String() string     { return strings.Join(*a, ",") }
func (a *addrList) Set(v string) error { *a = append(*a, v); return nil }

func cmdToken(args []string, stdout, stderr io.Writer) error {
	var (
		dir, kind, service, subject, team, role string
		addrs                                   addrList
		ttl                                     time.Duration
	)
	fs := cli.NewFlags("token", stderr)
	fs.StringVar(&dir, "data", ".muster", "dev data folder holding the dev issuer's key")
	fs.StringVar(&kind, "kind", "", "workload, prober, tool or operator (required)")
	fs.StringVar(&service, "service", "", "service the workload or prober is bound to")
	fs.StringVar(&subject, "subject", "", "subject (defaults to the service for workloads and probers)")
	fs.StringVar(&team, "team", "", "team of an operator or tool")
	fs.StringVar(&role, "role", "", "viewer, operator or admin (operators and tools)")
	fs.Var(&addrs, "address", "an IP address the token vouches for (repeatable)")
	fs.DurationVar(&ttl, "ttl", time.Hour, "token lifetime, at most 24h")
	if err := cli.Parse(fs, args); err != nil {
		return err
	}
	if kind == "" {
		fmt.Fprintln(stderr, "muster token: --kind is required")
		fs.PrintDefaults()
		return cli.ErrUsage
	}
	if _, err := os.Stat(filepath.Join(dir, "dev-issuer-key.pem")); err != nil {
		return fmt.Errorf("no dev issuer in %s: run `muster dev --data %s` first", dir, dir)
	}
	iss, err := devissuer.LoadOrCreate(dir)
	if err != nil {
		return err
	}
	k, err := identity.ParseKind(kind)
	if err != nil {
		return err
	}
	var r identity.Role
	if role != "" {
		if r, err = identity.ParseRole(role); err != nil {
			return err
		}
	}
	tok, err := iss.Mint(devissuer.TokenRequest{
		Kind: k, Subject: subject, Service: service, Team: team, Role: r, Addresses: addrs, TTL: ttl,
	}, time.Now())
	if err != nil {
		return err
	}
	fmt.Fprintln(stdout, tok)
	return nil
}

// toolPool reads the environment and opens a pool on the database a tool
// command works on: DATABASE_URL, or the dev cluster in cfg.DataDir
// (adopted when a muster dev is running on it). closeDB closes the pool and
// stops what was started.
func toolPool(ctx context.Context, cfg *Config, stderr io.Writer) (pool *pgxpool.Pool, closeDB func() error, err error) {
	if err := loadEnv(cfg); err != nil {
		return nil, nil, err
	}
	url, stop, err := openDatabase(ctx, *cfg, cli.QuietLogger(stderr))
	if err != nil {
		return nil, nil, err
	}
	target, err := newDBTarget(ctx, *cfg, url)
	if err != nil {
		return nil, nil, errors.Join(err, stop())
	}
	if pool, err = target.open(ctx, db.PoolConfig{IOTimeout: cfg.DBIOTimeout}); err != nil {
		return nil, nil, errors.Join(err, stop())
	}
	return pool, func() error { pool.Close(); return stop() }, nil
}

// openToolDB is the load generator's loadgen.Env.OpenDB: toolPool on the
// data folder dir, and the region the environment names.
func openToolDB(ctx context.Context, dir string, stderr io.Writer) (*pgxpool.Pool, string, func() error, error) {
	cfg := Config{DataDir: dir}
	pool, closeDB, err := toolPool(ctx, &cfg, stderr)
	return pool, cfg.Region, closeDB, err
}
