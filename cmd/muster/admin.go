package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/musterhq/muster/audit"
	"github.com/musterhq/muster/db"
	"github.com/musterhq/muster/identity"
	"github.com/musterhq/muster/internal/devissuer"
)

func cmdMigrate(ctx context.Context, args []string, stdout, stderr io.Writer) (err error) {
	if len(args) == 0 {
		fmt.Fprintln(stderr, "usage: muster migrate up|down|version [--data DIR]")
		return errUsage
	}
	verb := args[0]
	switch verb {
	case "up", "down", "version":
	default:
		fmt.Fprintf(stderr, "muster migrate: unknown verb %q (want up, down or version)\n", verb)
		return errUsage
	}
	cfg := Config{}
	fs := newFlags("migrate "+verb, stderr)
	dataFlag(fs, &cfg)
	if err := parse(fs, args[1:]); err != nil {
		return err
	}
	if err := loadEnv(&cfg); err != nil {
		return err
	}
	url, stop, err := openDatabase(ctx, cfg, quietLogger(stderr))
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, stop()) }()
	mg, err := db.NewMigrator(url)
	if err != nil {
		return err
	}
	defer mg.Close()
	switch verb {
	case "up":
		err = mg.Up()
	case "down":
		err = mg.Down()
	}
	if err != nil {
		return err
	}
	v, dirty, err := mg.Version()
	if err != nil {
		return err
	}
	fmt.Fprintf(stdout, "schema version %d", v)
	if dirty {
		fmt.Fprint(stdout, " (dirty: a migration failed half-way; fix it and force the version)")
	}
	fmt.Fprintln(stdout)
	return nil
}

func cmdAudit(ctx context.Context, args []string, stdout, stderr io.Writer) (err error) {
	if len(args) == 0 || args[0] != "verify" {
		fmt.Fprintln(stderr, "usage: muster audit verify [--data DIR]")
		return errUsage
	}
	cfg := Config{}
	fs := newFlags("audit verify", stderr)
	dataFlag(fs, &cfg)
	if err := parse(fs, args[1:]); err != nil {
		return err
	}
	pool, closeDB, err := toolPool(ctx, &cfg, stderr)
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, closeDB()) }()
	rep, err := audit.NewLog(pool).Verify(ctx)
	if err != nil {
		return err
	}
	fmt.Fprintf(stdout, "audit chain intact: %d rows, head %s\n", rep.Rows, rep.Head)
	return nil
}

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
	fs := newFlags("token", stderr)
	fs.StringVar(&dir, "data", ".muster", "dev data folder holding the dev issuer's key")
	fs.StringVar(&kind, "kind", "", "workload, prober, tool or operator (required)")
	fs.StringVar(&service, "service", "", "service the workload or prober is bound to")
	fs.StringVar(&subject, "subject", "", "subject (defaults to the service for workloads and probers)")
	fs.StringVar(&team, "team", "", "team of an operator or tool")
	fs.StringVar(&role, "role", "", "viewer, operator or admin (operators and tools)")
	fs.Var(&addrs, "address", "an IP address the token vouches for (repeatable)")
	fs.DurationVar(&ttl, "ttl", time.Hour, "token lifetime, at most 24h")
	if err := parse(fs, args); err != nil {
		return err
	}
	if kind == "" {
		fmt.Fprintln(stderr, "muster token: --kind is required")
		fs.PrintDefaults()
		return errUsage
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

func quietLogger(w io.Writer) *slog.Logger {
	return slog.New(slog.NewTextHandler(w, &slog.HandlerOptions{Level: slog.LevelWarn}))
}

// dataFlag adds the --data flag of the commands that work on a database.
func dataFlag(fs *flag.FlagSet, cfg *Config) {
	fs.StringVar(&cfg.DataDir, "data", ".muster", "dev data folder (used when DATABASE_URL is not set)")
}

// toolPool reads the environment and opens a pool on the database a tool
// command works on: DATABASE_URL, or the dev cluster in cfg.DataDir
// (adopted when a muster dev is running on it). closeDB closes the pool and
// stops what was started.
func toolPool(ctx context.Context, cfg *Config, stderr io.Writer) (pool *pgxpool.Pool, closeDB func() error, err error) {
	if err := loadEnv(cfg); err != nil {
		return nil, nil, err
	}
	url, stop, err := openDatabase(ctx, *cfg, quietLogger(stderr))
	if err != nil {
		return nil, nil, err
	}
	if pool, err = db.OpenPool(ctx, db.PoolConfig{URL: url, IOTimeout: cfg.DBIOTimeout}); err != nil {
		return nil, nil, errors.Join(err, stop())
	}
	return pool, func() error { pool.Close(); return stop() }, nil
}
