package db

import (
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Open connects a pool to url with the default PoolConfig and pings it
// within the context's deadline.
func Open(ctx context.Context, url string) (*pgxpool.Pool, error) {
	return OpenPool(ctx, PoolConfig{URL: url})
}

// PoolConfig configures OpenPool.
type PoolConfig struct {
	URL string
	// IOTimeout is how long a connection waits for PostgreSQL's next byte
	// while a reply is owed before the connection is given up as dead:
	// DefaultIOTimeout when zero (see there for why), negative for none.
	IOTimeout time.Duration
	// MaxConns bounds the pool; zero keeps pgxpool's default (the URL's
	// pool_max_conns, or the larger of 4 and the number of CPUs).
	MaxConns int32
	// Tracer, when set, traces every query on the pool's connections
	// (tests count the queries a request makes with one).
	Tracer pgx.QueryTracer
	// Lazy skips the ping: the pool connects on first use. For a replica
	// that starts while PostgreSQL is unreachable and serves its peers'
	// views until it answers.
	Lazy bool
	// IAM, when set, gives every new connection the current IAM database
	// authentication token as its password (Aurora and RDS IAM auth); the
	// URL's password is then ignored.
	IAM *IAMTokens
	// RootCAs, when set, verify the server's certificate wherever the URL
	// asks for verification (sslmode verify-full or verify-ca) but names
	// no sslrootcert, instead of the system roots (SetRootCAs): the RDS CA
	// bundle built into muster. An sslrootcert in the URL wins.
	RootCAs *x509.CertPool
}

// OpenPool connects a pool and pings it within the context's deadline.
//
// Every query has two bounds besides the caller's context: the server
// cancels a statement after statement_timeout (15 s), and the client gives
// a connection up when PostgreSQL falls silent for IOTimeout while a reply
// is owed (a frozen server would otherwise hold a query, and whoever waits
// on it, forever).
func OpenPool(ctx context.Context, c PoolConfig) (*pgxpool.Pool, error) {
	cfg, err := pgxpool.ParseConfig(c.URL)
	if err != nil {
		return nil, fmt.Errorf("parse database url: %w", err)
	}
	if cfg.ConnConfig.RuntimeParams == nil {
		cfg.ConnConfig.RuntimeParams = map[string]string{}
	}
	if _, ok := cfg.ConnConfig.RuntimeParams["statement_timeout"]; !ok {
		cfg.ConnConfig.RuntimeParams["statement_timeout"] = "15000"
	}
	cfg.ConnConfig.ConnectTimeout = 5 * time.Second
	if c.IOTimeout == 0 {
		c.IOTimeout = DefaultIOTimeout
	}
	if c.IOTimeout > 0 {
		cfg.ConnConfig.DialFunc = dialWithIOTimeout(cfg.ConnConfig.DialFunc, c.IOTimeout)
	}
	if c.MaxConns > 0 {
		cfg.MaxConns = c.MaxConns
	}
	if c.Tracer != nil {
		cfg.ConnConfig.Tracer = c.Tracer
	}
	if c.IAM != nil {
		cfg.BeforeConnect = c.IAM.beforeConnect
	}
	SetRootCAs(&cfg.ConnConfig.Config, c.RootCAs)
	cfg.ConnConfig.OnPgError = closeOnReadOnly(cfg.ConnConfig.OnPgError)
	cfg.AfterConnect = func(_ context.Context, c *pgx.Conn) error {
		registerUUID(c.TypeMap())
		return nil
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("open pool: %w", err)
	}
	if c.Lazy {
		return pool, nil
	}
	if err := pool.Ping(ctx); err != nil {
		pool.Close()
		return nil, fmt.Errorf("ping database: %w", err)
	}
	return pool, nil
}

// WithTx runs fn in one transaction and commits it when fn returns nil. fn
// receives only transaction-bound queries, so no statement can slip outside
// the transaction by accident.
func WithTx(ctx context.Context, pool *pgxpool.Pool, fn func(q *Queries) error) error {
	return pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		return fn(New(tx))
	})
}

// closeOnReadOnly wraps pgconn's error handler so a connection that meets
// SQLSTATE 25006 (read_only_sql_transaction) is closed on the spot, and
// the pool, finding it closed on release, drops it instead of handing it
// out again. muster never asks for a read-only transaction, so the error
// means the server itself turned read-only: after an Aurora writer
// failover a session that survived on the demoted instance would fail
// every write until the process restarted. The transaction it was in dies
// with it (PostgreSQL rolls back a session that ends), so no write is half
// applied; new connections land on the writer (target_session_attrs, see
// WithReadWrite).
func closeOnReadOnly(next pgconn.PgErrorHandler) pgconn.PgErrorHandler {
	return func(pc *pgconn.PgConn, err *pgconn.PgError) bool {
		if err.Code == codeReadOnlyTransaction {
			return false
		}
		return next == nil || next(pc, err)
	}
}

// codeReadOnlyTransaction is SQLSTATE read_only_sql_transaction.
const codeReadOnlyTransaction = "25006"

// WithReadWrite adds target_session_attrs=read-write to a postgres:// URL
// that does not set target_session_attrs, so a connection never settles on
// a reader or a demoted writer: pgx asks each new session whether it is
// read-only and moves on (or fails) if it is. A URL that sets it, or a
// PGTARGETSESSIONATTRS environment, is left as it is.
func WithReadWrite(databaseURL string) (string, error) {
	if os.Getenv("PGTARGETSESSIONATTRS") != "" {
		return databaseURL, nil
	}
	u, err := url.Parse(databaseURL)
	if err != nil || (u.Scheme != "postgres" && u.Scheme != "postgresql") {
		return "", errors.New("database url: want a postgres:// URL") // the error would carry the password
	}
	q := u.Query()
	if q.Has("target_session_attrs") {
		return databaseURL, nil
	}
	q.Set("target_session_attrs", "read-write")
	u.RawQuery = q.Encode()
	return u.String(), nil
}

// IsUnavailable reports whether err means the database could not be
// reached or did not answer in time (as opposed to refusing a statement),
// so callers can answer 503: a refused or broken connection, a server
// shutting down, a connection given up by the I/O backstop, or a deadline
// that ran out while waiting for PostgreSQL. A context deadline counts: the
// deadlines on database work are database budgets (a request's DBTimeout, a
// worker's per-call timeout), so running out of one means the database did
// not answer within it.
func IsUnavailable(err error) bool {
	if err == nil {
		return false
	}
	if IsTimeout(err) {
		return true
	}
	var tokErr *TokenError
	if errors.As(err, &tokErr) {
		return true
	}
	var connErr *pgconn.ConnectError
	if errors.As(err, &connErr) {
		return true
	}
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		// Class 08: connection exception; 57P0x: server shutting down or
		// not accepting connections; 25006: the server turned read-only
		// (a demoted writer, see closeOnReadOnly), so there is no writer
		// to take the statement until the failover ends.
		return pgErr.Code == codeReadOnlyTransaction ||
			len(pgErr.Code) == 5 && (pgErr.Code[:2] == "08" || pgErr.Code[:4] == "57P0")
	}
	return pgconn.SafeToRetry(err)
}

// IsTimeout reports whether err is a deadline running out: a context
// deadline, or a connection the I/O backstop gave up on. PostgreSQL's own
// statement_timeout (57014) is not one: that server answered.
func IsTimeout(err error) bool {
	if err == nil {
		return false
	}
	if errors.Is(err, context.DeadlineExceeded) || pgconn.Timeout(err) {
		return true
	}
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

// IsUniqueViolation reports whether err is a unique-constraint violation,
// optionally of the named constraint.
func IsUniqueViolation(err error, constraint string) bool {
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) || pgErr.Code != "23505" {
		return false
	}
	return constraint == "" || pgErr.ConstraintName == constraint
}

// registerUUID makes pgx scan binary uuid columns straight into
// google/uuid.UUID and encode it straight from its bytes. Without it pgx
// goes through uuid's sql.Scanner and driver.Valuer, formatting each value
// as text and parsing it back: a third of the time of a rebuild that reads
// millions of rows.
func registerUUID(m *pgtype.Map) {
	m.RegisterType(&pgtype.Type{Name: "uuid", OID: pgtype.UUIDOID, Codec: uuidCodec{}})
}

type uuidCodec struct{ pgtype.UUIDCodec }

func (c uuidCodec) PlanScan(m *pgtype.Map, oid uint32, format int16, target any) pgtype.ScanPlan {
	if _, ok := target.(*uuid.UUID); ok && format == pgtype.BinaryFormatCode {
		return scanUUID{}
	}
	return c.UUIDCodec.PlanScan(m, oid, format, target)
}

func (c uuidCodec) PlanEncode(m *pgtype.Map, oid uint32, format int16, value any) pgtype.EncodePlan {
	if _, ok := value.(uuid.UUID); ok && format == pgtype.BinaryFormatCode {
		return encodeUUID{}
	}
	return c.UUIDCodec.PlanEncode(m, oid, format, value)
}

// encodeUUID writes a uuid.UUID's 16 bytes. Without it pgx asks the value
// for its driver.Value (a formatted string) and parses that back, which was
// most of the cost of COPYing observed windows.
type encodeUUID struct{}

func (encodeUUID) Encode(value any, buf []byte) ([]byte, error) {
	id := value.(uuid.UUID)
	return append(buf, id[:]...), nil
}

type scanUUID struct{}

func (scanUUID) Scan(src []byte, dst any) error {
	if len(src) != 16 {
		if src == nil {
			return errors.New("scan uuid: NULL into a non-pointer uuid.UUID")
		}
		return fmt.Errorf("scan uuid: %d bytes, want 16", len(src))
	}
	copy(dst.(*uuid.UUID)[:], src)
	return nil
}
