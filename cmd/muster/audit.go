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
	"strconv"
	"strings"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	awsconfig "github.com/aws/aws-sdk-go-v2/config"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/musterhq/muster/db"
	"github.com/musterhq/muster/internal/app"
	"github.com/musterhq/muster/internal/audit"
	"github.com/musterhq/muster/internal/audit/s3sink"
	"github.com/musterhq/muster/internal/cli"
	"github.com/musterhq/muster/internal/policy"
	"github.com/musterhq/muster/internal/seal"
)

// AuditConfig configures the audit log's signed checkpoints
// (docs/audit.md).
type AuditConfig struct {
	// Checkpoints is the sink: a directory, or s3://bucket/prefix
	// (MUSTER_AUDIT_CHECKPOINTS; no flag on serve/dev). muster dev
	// defaults to DATA/audit-checkpoints; muster serve without one writes
	// no checkpoints and says so at start.
	Checkpoints string
	// SigningKeyFile is the Ed25519 private key (PKCS #8 PEM, mode 0600)
	// checkpoints are signed with (MUSTER_AUDIT_SIGNING_KEY_FILE); muster
	// dev makes DATA/audit-signing.key. PostgreSQL never holds it.
	SigningKeyFile string
	// PublicKeyFiles are more keys earlier checkpoints may be signed by
	// (MUSTER_AUDIT_PUBLIC_KEY_FILES, comma-separated), for a rotation.
	PublicKeyFiles []string
	// Interval between checkpoints (MUSTER_AUDIT_CHECKPOINT_INTERVAL, 1m)
	// and Heartbeat, the longest gap while the chain does not move
	// (MUSTER_AUDIT_CHECKPOINT_HEARTBEAT, 1h).
	Interval, Heartbeat time.Duration
	// S3Endpoint is an S3-compatible endpoint to use instead of AWS's
	// (MUSTER_AUDIT_S3_ENDPOINT; path-style addressing). Region and
	// credentials come from the AWS SDK's default chain (AWS_REGION,
	// AWS_ACCESS_KEY_ID…, the instance or pod role).
	S3Endpoint string
	// S3Retention is each checkpoint's Object Lock retention
	// (MUSTER_AUDIT_S3_RETENTION: a duration, or days as "1825d"; 5 years).
	S3Retention time.Duration
	// MismatchShare is the share of the database's live sealed rows that
	// may be sealed by keys this replica does not trust before it refuses
	// to start (MUSTER_SEAL_MISMATCH_SHARE, 0.05; keys.go).
	MismatchShare float64
	// KeyWatchEvery is how often a running replica counts the live rows
	// by sealing key for seal_key_mismatch (MUSTER_SEAL_WATCH_INTERVAL,
	// 30s; app.KeyWatch).
	KeyWatchEvery time.Duration
	// SecretFilesAllowShared (MUSTER_SECRET_FILES_ALLOW_SHARED=true)
	// accepts a signing key file others may read when it lies on a
	// read-only mount, as a CSI secret store writes it (mode 0644);
	// audit.KeyFilePolicy says why both are needed.
	SecretFilesAllowShared bool
}

func (c *AuditConfig) devDefaults(dataDir string) {
	if c.Checkpoints == "" {
		c.Checkpoints = filepath.Join(dataDir, "audit-checkpoints")
	}
	if c.SigningKeyFile == "" {
		c.SigningKeyFile = filepath.Join(dataDir, "audit-signing.key")
	}
}

// loadAuditEnv fills c.Audit from the environment (flags already parsed
// win), with muster dev's defaults under the data folder.
func loadAuditEnv(c *Config) error {
	a := &c.Audit
	a.Checkpoints = cmpOr(a.Checkpoints, os.Getenv("MUSTER_AUDIT_CHECKPOINTS"))
	a.SigningKeyFile = cmpOr(a.SigningKeyFile, os.Getenv("MUSTER_AUDIT_SIGNING_KEY_FILE"))
	for _, f := range strings.Split(os.Getenv("MUSTER_AUDIT_PUBLIC_KEY_FILES"), ",") {
		if f = strings.TrimSpace(f); f != "" {
			a.PublicKeyFiles = append(a.PublicKeyFiles, f)
		}
	}
	a.S3Endpoint = os.Getenv("MUSTER_AUDIT_S3_ENDPOINT")
	if v := os.Getenv("MUSTER_SECRET_FILES_ALLOW_SHARED"); v != "" {
		shared, err := strconv.ParseBool(v)
		if err != nil {
			return fmt.Errorf("MUSTER_SECRET_FILES_ALLOW_SHARED: %q is not true or false", v)
		}
		a.SecretFilesAllowShared = shared
	}
	a.MismatchShare = seal.DefaultMismatchShare
	if v := os.Getenv("MUSTER_SEAL_MISMATCH_SHARE"); v != "" {
		f, err := strconv.ParseFloat(v, 64)
		if err != nil || f < 0 || f >= 1 {
			return fmt.Errorf("MUSTER_SEAL_MISMATCH_SHARE: %q: want a share in [0, 1), e.g. 0.05", v)
		}
		a.MismatchShare = f
	}
	var err error
	a.Interval, a.Heartbeat, a.S3Retention, a.KeyWatchEvery = time.Minute, time.Hour, s3sink.DefaultRetention, 30*time.Second
	for _, d := range []struct {
		env string
		dst *time.Duration
	}{
		{"MUSTER_AUDIT_CHECKPOINT_INTERVAL", &a.Interval},
		{"MUSTER_AUDIT_CHECKPOINT_HEARTBEAT", &a.Heartbeat},
		{"MUSTER_AUDIT_S3_RETENTION", &a.S3Retention},
		{"MUSTER_SEAL_WATCH_INTERVAL", &a.KeyWatchEvery},
	} {
		if v := os.Getenv(d.env); v != "" {
			if *d.dst, err = parseDays(v); err != nil {
				return fmt.Errorf("%s: %w", d.env, err)
			}
		}
	}
	if c.Dev && c.DataDir != "" {
		a.devDefaults(c.DataDir)
	}
	return nil
}

// parseDays reads a Go duration, or a whole number of days ("1825d").
func parseDays(v string) (time.Duration, error) {
	if n, ok := strings.CutSuffix(v, "d"); ok {
		d, err := strconv.Atoi(n)
		if err != nil {
			return 0, fmt.Errorf("%q: want a duration or a number of days, e.g. 1825d", v)
		}
		return time.Duration(d) * 24 * time.Hour, nil
	}
	return time.ParseDuration(v)
}

// Validate checks the audit settings.
func (a *AuditConfig) Validate() error {
	if a.Interval == 0 {
		a.Interval = time.Minute
	}
	if a.Heartbeat == 0 {
		a.Heartbeat = time.Hour
	}
	if a.S3Retention == 0 {
		a.S3Retention = s3sink.DefaultRetention
	}
	if a.Interval < time.Second || a.Heartbeat < a.Interval {
		return fmt.Errorf("MUSTER_AUDIT_CHECKPOINT_INTERVAL (%s) must be 1s or more and MUSTER_AUDIT_CHECKPOINT_HEARTBEAT (%s) no shorter", a.Interval, a.Heartbeat)
	}
	if a.S3Retention < 24*time.Hour {
		return fmt.Errorf("MUSTER_AUDIT_S3_RETENTION %s is below a day (ADR-15 keeps the audit log 5 years)", a.S3Retention)
	}
	if a.Checkpoints == "" {
		return nil
	}
	if a.SigningKeyFile == "" {
		return errors.New("audit checkpoints (MUSTER_AUDIT_CHECKPOINTS) need a signing key: MUSTER_AUDIT_SIGNING_KEY_FILE")
	}
	if strings.HasPrefix(a.Checkpoints, "s3:") {
		if _, _, err := s3sink.ParseURL(a.Checkpoints); err != nil {
			return err
		}
	}
	return nil
}

// openSink opens a checkpoint sink: s3://bucket/prefix, or a directory.
func openSink(ctx context.Context, a AuditConfig, spec string) (audit.Sink, error) {
	if !strings.HasPrefix(spec, "s3:") {
		return audit.DirSink{Dir: spec}, nil
	}
	bucket, prefix, err := s3sink.ParseURL(spec)
	if err != nil {
		return nil, err
	}
	awsCfg, err := awsconfig.LoadDefaultConfig(ctx)
	if err != nil {
		return nil, fmt.Errorf("checkpoint sink %s: AWS configuration: %w", spec, err)
	}
	client := s3.NewFromConfig(awsCfg, func(o *s3.Options) {
		if a.S3Endpoint != "" {
			o.BaseEndpoint, o.UsePathStyle = aws.String(a.S3Endpoint), true
		}
	})
	return s3sink.New(s3sink.Config{Client: client, Bucket: bucket, Prefix: prefix, Retention: a.S3Retention})
}

// regionKey is the region's signing key, when one is configured
// (MUSTER_AUDIT_SIGNING_KEY_FILE; muster dev makes one): it signs the
// audit checkpoints and seals the overrides muster puts in force
// (policy/seal.go). keys are the further public keys trusted for both
// (MUSTER_AUDIT_PUBLIC_KEY_FILES, a rotation). A nil signer means no key.
func regionKey(cfg Config) (*audit.KeyFileSigner, audit.Keys, error) {
	a := cfg.Audit
	keys := audit.Keys{}
	if len(a.PublicKeyFiles) > 0 {
		var err error
		if keys, err = audit.LoadPublicKeys(a.PublicKeyFiles...); err != nil {
			return nil, nil, err
		}
	}
	if a.SigningKeyFile == "" {
		return nil, keys, nil
	}
	var (
		signer *audit.KeyFileSigner
		err    error
	)
	if cfg.Dev {
		signer, err = audit.LoadOrCreateKeyFile(a.SigningKeyFile)
	} else {
		signer, err = audit.LoadKeyFileWith(a.SigningKeyFile, audit.KeyFilePolicy{AllowShared: a.SecretFilesAllowShared})
	}
	return signer, keys, err
}

// toolSealKey is the region's key a tool working on the data folder dir
// seals with: MUSTER_AUDIT_SIGNING_KEY_FILE, or the one muster dev makes
// in dir (made now if missing, as muster dev would). Nil without either.
func toolSealKey(dir string) (seal.Signer, error) {
	cfg := Config{Dev: true, DataDir: dir}
	if err := loadAuditEnv(&cfg); err != nil {
		return nil, err
	}
	signer, _, err := regionKey(cfg)
	if err != nil || signer == nil {
		return nil, err
	}
	return signer, nil
}

// sealOverrides has muster seal the instances, overrides and shifts it
// writes with the region's key, and act only on sealed ones (the app hands
// the policy configuration's key to the registry and shifts too); without
// a key, muster trusts those tables and says so.
func sealOverrides(ac *app.Config, signer *audit.KeyFileSigner, keys audit.Keys, log *slog.Logger) {
	if signer == nil {
		log.Warn("instances, contracts, overrides and shifts are not sealed: a row written into those tables by anyone who can write the database is acted on (set MUSTER_AUDIT_SIGNING_KEY_FILE; docs/overrides.md: what muster writes is sealed)")
		return
	}
	ac.Policy.Sealer, ac.Policy.SealKeys = signer, policy.SealKeys(keys)
	log.Info("instances, contracts, overrides and shifts are sealed", "key_id", signer.KeyID())
}

// newAuditCheckpoints returns the worker that signs audit checkpoints
// into the configured sink with the region's key, or nil when
// checkpoints are off, which is said at start. Refused evidence is
// summarised by the app (app.Config.Refusals).
func newAuditCheckpoints(ctx context.Context, cfg Config, signer *audit.KeyFileSigner, keys audit.Keys, pool *pgxpool.Pool, log *slog.Logger, reg prometheus.Registerer) (*audit.Checkpointer, error) {
	a := cfg.Audit
	if a.Checkpoints == "" {
		log.Warn("audit checkpoints are off: nothing outside PostgreSQL anchors the audit chain (set MUSTER_AUDIT_CHECKPOINTS and MUSTER_AUDIT_SIGNING_KEY_FILE; docs/audit.md)")
		return nil, nil
	}
	if signer == nil { // Validate refuses checkpoints without a key file
		return nil, errors.New("audit checkpoints need a signing key: MUSTER_AUDIT_SIGNING_KEY_FILE")
	}
	sink, err := openSink(ctx, a, a.Checkpoints)
	if err != nil {
		return nil, err
	}
	cp, err := audit.NewCheckpointer(audit.CheckpointerConfig{
		Pool: pool, Signer: signer, Sink: sink, Keys: keys, Interval: a.Interval, Heartbeat: a.Heartbeat, Logger: log, Registerer: reg,
	})
	if err != nil {
		return nil, err
	}
	log.Info("audit checkpoints", "sink", sink.String(), "key_id", signer.KeyID(), "every", a.Interval)
	return cp, nil
}

// keyList collects repeated --key flags.
type keyList []string

func (k *keyList) String() string     { return strings.Join(*k, ",") }
func (k *keyList) Set(v string) error { *k = append(*k, v); return nil }

// auditFlags are the flags verify and export share.
type auditFlags struct {
	checkpoints string
	keys        keyList
}

func (f *auditFlags) add(fs *flag.FlagSet) {
	fs.StringVar(&f.checkpoints, "checkpoints", "", "checkpoint sink: a directory or s3://bucket/prefix (MUSTER_AUDIT_CHECKPOINTS; muster dev's DATA/audit-checkpoints when it exists)")
	fs.Var(&f.keys, "key", "a PEM file with a trusted public key (or the signing key itself); repeatable (MUSTER_AUDIT_PUBLIC_KEY_FILES, the signing key's .pub beside it, or muster dev's DATA/audit-signing.key.pub)")
}

// resolve works out the sink and keys: flags, then the environment, then
// muster dev's files in the data folder.
func (f *auditFlags) resolve(cfg *Config) (sinkSpec string, keys []string) {
	sinkSpec = cmpOr(f.checkpoints, os.Getenv("MUSTER_AUDIT_CHECKPOINTS"))
	keys = f.keys
	if len(keys) == 0 {
		for _, k := range strings.Split(os.Getenv("MUSTER_AUDIT_PUBLIC_KEY_FILES"), ",") {
			if k = strings.TrimSpace(k); k != "" {
				keys = append(keys, k)
			}
		}
	}
	if len(keys) == 0 {
		if k := os.Getenv("MUSTER_AUDIT_SIGNING_KEY_FILE"); k != "" {
			keys = append(keys, k+".pub")
		}
	}
	if cfg.DataDir != "" && os.Getenv("DATABASE_URL") == "" && os.Getenv("DATABASE_URL_FILE") == "" {
		dev := AuditConfig{}
		dev.devDefaults(cfg.DataDir)
		if _, err := os.Stat(dev.Checkpoints); sinkSpec == "" && err == nil {
			sinkSpec = dev.Checkpoints
		}
		if len(keys) == 0 {
			keys = append(keys, dev.SigningKeyFile+".pub")
		}
	}
	return sinkSpec, keys
}

func cmdAudit(ctx context.Context, args []string, stdout, stderr io.Writer) (err error) {
	if len(args) == 0 || (args[0] != "verify" && args[0] != "export") {
		fmt.Fprintln(stderr, "usage: muster audit verify [--data DIR] [--checkpoints SINK] [--key FILE]... [--export FILE]\n       muster audit export --since TIME --until TIME [--data DIR] [--checkpoints SINK] [--key FILE]... [--out FILE]")
		return cli.ErrUsage
	}
	if args[0] == "export" {
		return cmdAuditExport(ctx, args[1:], stdout, stderr)
	}
	cfg := Config{}
	var (
		af     auditFlags
		export string
	)
	fs := cli.NewFlags("audit verify", stderr)
	cli.DataFlag(fs, &cfg.DataDir)
	af.add(fs)
	fs.StringVar(&export, "export", "", "verify this export file (muster audit export) offline, without a database")
	if err := cli.Parse(fs, args[1:]); err != nil {
		return err
	}
	sinkSpec, keyFiles := af.resolve(&cfg)
	if (export != "" || sinkSpec != "") && len(keyFiles) == 0 {
		return errors.New("checking against checkpoints needs the public key they are signed with: --key FILE (or MUSTER_AUDIT_PUBLIC_KEY_FILES)")
	}
	if export != "" {
		keys, err := audit.LoadPublicKeys(keyFiles...)
		if err != nil {
			return err
		}
		f, err := os.Open(export)
		if err != nil {
			return err
		}
		defer f.Close()
		rep, err := audit.VerifyExport(f, keys)
		if err != nil {
			return err
		}
		if rep.FirstSeq == 0 {
			fmt.Fprintln(stdout, "audit export intact: it holds no rows")
			return nil
		}
		if rep.Checkpoints == 0 {
			return fmt.Errorf("audit export rows %d to %d are self-consistent but no checkpoint anchors them", rep.FirstSeq, rep.LastSeq)
		}
		fmt.Fprintf(stdout, "audit export intact: rows %d to %d, anchored by %d checkpoints up to seq %d", rep.FirstSeq, rep.LastSeq, rep.Checkpoints, rep.AnchoredSeq)
		if rep.Unanchored > 0 {
			fmt.Fprintf(stdout, "; the last %d rows are NOT anchored (no checkpoint covered them yet when exported)", rep.Unanchored)
		}
		fmt.Fprintln(stdout)
		return nil
	}
	pool, closeDB, err := toolPool(ctx, &cfg, stderr)
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, closeDB()) }()
	if sinkSpec == "" {
		rep, err := audit.NewLog(pool).Verify(ctx)
		if err != nil {
			return err
		}
		fmt.Fprintf(stdout, "audit chain intact: %d rows, head %s\nnot checked against checkpoints (no --checkpoints): this shows only that the table is self-consistent, which whoever can write it can arrange\n", rep.Rows, rep.Head)
		return nil
	}
	keys, err := audit.LoadPublicKeys(keyFiles...)
	if err != nil {
		return err
	}
	sink, err := openSink(ctx, cfg.Audit, sinkSpec)
	if err != nil {
		return err
	}
	cps, err := audit.LoadCheckpoints(ctx, sink, keys)
	if err != nil {
		return fmt.Errorf("checkpoints in %s: %w", sink, err)
	}
	rep, err := audit.VerifyCheckpoints(ctx, db.New(pool), cps)
	if err != nil {
		return fmt.Errorf("against the checkpoints in %s: %w", sink, err)
	}
	fmt.Fprintf(stdout, "audit chain intact: %d rows, head %s; checked against %d checkpoints in %s, the newest at seq %d", rep.Rows, rep.Head, rep.Checkpoints, sink, rep.AnchoredSeq)
	if n := rep.HeadSeq - rep.AnchoredSeq; n > 0 {
		fmt.Fprintf(stdout, " (%d newer rows are not anchored yet)", n)
	}
	fmt.Fprintln(stdout)
	if rep.Checkpoints == 0 {
		return fmt.Errorf("no checkpoints in %s: nothing anchors the chain", sink)
	}
	return nil
}

func cmdAuditExport(ctx context.Context, args []string, stdout, stderr io.Writer) (err error) {
	cfg := Config{}
	var (
		af                auditFlags
		since, until, out string
	)
	fs := cli.NewFlags("audit export", stderr)
	cli.DataFlag(fs, &cfg.DataDir)
	af.add(fs)
	fs.StringVar(&since, "since", "", "export rows at or after this time (RFC 3339, required)")
	fs.StringVar(&until, "until", "", "export rows before this time (RFC 3339; default now)")
	fs.StringVar(&out, "out", "", "write the export here instead of standard output")
	if err := cli.Parse(fs, args); err != nil {
		return err
	}
	from, err := time.Parse(time.RFC3339, since)
	if err != nil {
		fmt.Fprintln(stderr, "muster audit export: --since wants an RFC 3339 time, e.g. 2026-11-01T00:00:00Z")
		return cli.ErrUsage
	}
	to := time.Now()
	if until != "" {
		if to, err = time.Parse(time.RFC3339, until); err != nil {
			fmt.Fprintln(stderr, "muster audit export: --until wants an RFC 3339 time")
			return cli.ErrUsage
		}
	}
	sinkSpec, keyFiles := af.resolve(&cfg)
	if len(keyFiles) == 0 {
		return errors.New("muster audit export needs the public key the checkpoints are signed with: --key FILE (or MUSTER_AUDIT_PUBLIC_KEY_FILES)")
	}
	if sinkSpec == "" {
		return errors.New("muster audit export needs the checkpoint sink (--checkpoints): an export without checkpoints proves nothing")
	}
	keys, err := audit.LoadPublicKeys(keyFiles...)
	if err != nil {
		return err
	}
	pool, closeDB, err := toolPool(ctx, &cfg, stderr)
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, closeDB()) }()
	sink, err := openSink(ctx, cfg.Audit, sinkSpec)
	if err != nil {
		return err
	}
	cps, err := audit.LoadCheckpoints(ctx, sink, keys)
	if err != nil {
		return fmt.Errorf("checkpoints in %s: %w", sink, err)
	}
	w := stdout
	if out != "" {
		f, err := os.OpenFile(out, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o644)
		if err != nil {
			return err
		}
		defer func() { err = errors.Join(err, f.Close()) }()
		w = f
	}
	rep, err := audit.Export(ctx, db.New(pool), cps, sink, from, to, w)
	if err != nil {
		return err
	}
	fmt.Fprintf(stderr, "exported rows %d to %d with %d checkpoints (anchored up to seq %d, %d rows not anchored yet)\n", rep.FirstSeq, rep.LastSeq, rep.Checkpoints, rep.AnchoredSeq, rep.Unanchored)
	return nil
}
