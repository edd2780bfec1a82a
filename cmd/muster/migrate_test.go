package main

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"net/http"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgproto3"

	"github.com/musterhq/muster/db"
	"github.com/musterhq/muster/db/dbtest"
	"github.com/musterhq/muster/internal/cli"
	"github.com/musterhq/muster/internal/rdsca"
	"github.com/musterhq/muster/internal/tlsreload/tlstest"
)

// TestMigrateForceAndStatus drives `muster migrate` on real PostgreSQL
// as an operator meets a dirty schema: status and up say it is dirty and
// name `muster migrate force VERSION`; force refuses a version that is no
// migration and changes nothing; force to a known one clears it, with a
// log line saying from what, to what, on which database and by whom (and
// no password); up then has nothing to do. A schema dirty at a migration
// this release knows and runs in one transaction (a replica killed while
// migrating) is repaired by up itself. (Not parallel: the commands read
// DATABASE_URL.)
func TestMigrateForceAndStatus(t *testing.T) {
	ctx := context.Background()
	u := dbtest.URL(t)
	t.Setenv("DATABASE_URL", u)
	t.Setenv("MUSTER_DB_IAM", "")
	conn, err := pgx.Connect(ctx, u)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	last, err := db.LatestMigration()
	if err != nil {
		t.Fatal(err)
	}
	version := func() (v uint, dirty bool) {
		t.Helper()
		if err := conn.QueryRow(ctx, `SELECT version, dirty FROM schema_migrations`).Scan(&v, &dirty); err != nil {
			t.Fatal(err)
		}
		return v, dirty
	}

	out, _, err := runCmd(t, "migrate", "status")
	if err != nil || out != fmt.Sprintf("schema version %d\nthis release's last migration is %d: up to date\n", last, last) {
		t.Fatalf("status on a migrated database: %q %v", out, err)
	}

	// A newer release's migration failed half-way: not ours to repair.
	if _, err := conn.Exec(ctx, `UPDATE schema_migrations SET version = $1, dirty = true`, last+1); err != nil {
		t.Fatal(err)
	}
	out, _, err = runCmd(t, "migrate", "status")
	if err != nil || !strings.Contains(out, fmt.Sprintf("schema version %d (dirty", last+1)) || !strings.Contains(out, "muster migrate force VERSION") ||
		!strings.Contains(out, "a newer release migrated") {
		t.Fatalf("status on a dirty schema: %q %v", out, err)
	}
	_, _, err = runCmd(t, "migrate", "up")
	if err == nil || !strings.Contains(err.Error(), fmt.Sprintf("dirty at version %d", last+1)) || !strings.Contains(err.Error(), "muster migrate force VERSION") {
		t.Fatalf("up on a dirty schema: %v, want the refusal naming the force command", err)
	}

	for _, tc := range []struct {
		args []string
		want error
	}{
		{[]string{"force", fmt.Sprint(last + 1)}, db.ErrUnknownVersion},
		{[]string{"force", "999999"}, db.ErrUnknownVersion},
		{[]string{"force", "-3"}, cli.ErrUsage},
		{[]string{"force", "latest"}, cli.ErrUsage},
		{[]string{"force"}, cli.ErrUsage},
		{[]string{"force", fmt.Sprint(last), "extra"}, cli.ErrUsage},
	} {
		_, errOut, err := runCmd(t, append([]string{"migrate"}, tc.args...)...)
		if !errors.Is(err, tc.want) {
			t.Errorf("migrate %v: %v (%s), want %v", tc.args, err, errOut, tc.want)
		}
		if v, dirty := version(); v != last+1 || !dirty {
			t.Fatalf("migrate %v changed the version to %d dirty %v", tc.args, v, dirty)
		}
	}

	out, errOut, err := runCmd(t, "migrate", "force", fmt.Sprint(last))
	if err != nil || out != fmt.Sprintf("schema version %d\n", last) {
		t.Fatalf("force %d: %q %q %v", last, out, errOut, err)
	}
	for _, want := range []string{"muster migrate force", fmt.Sprintf("from=%d", last+1), "from_dirty=true", fmt.Sprintf("to=%d", last), "database=postgres://", "by="} {
		if !strings.Contains(errOut, want) {
			t.Errorf("the force's log line lacks %q:\n%s", want, errOut)
		}
	}
	if v, dirty := version(); v != last || dirty {
		t.Fatalf("after force: version %d dirty %v", v, dirty)
	}
	if out, _, err := runCmd(t, "migrate", "up"); err != nil || out != fmt.Sprintf("schema version %d\n", last) {
		t.Fatalf("up after force: %q %v", out, err)
	}

	// A replica killed during the last migration: its transaction is
	// gone, the version says dirty. Up runs it again, and says so.
	if _, _, err := runCmd(t, "migrate", "down"); err != nil {
		t.Fatal(err)
	}
	if _, err := conn.Exec(ctx, `UPDATE schema_migrations SET version = $1, dirty = true`, last); err != nil {
		t.Fatal(err)
	}
	out, errOut, err = runCmd(t, "migrate", "up")
	if err != nil || out != fmt.Sprintf("schema version %d\n", last) || !strings.Contains(errOut, fmt.Sprintf("run again\" migration=%d", last)) {
		t.Fatalf("up on a schema a killed migration left dirty: %q %q %v", out, errOut, err)
	}
	if v, dirty := version(); v != last || dirty {
		t.Fatalf("after the repair: version %d dirty %v", v, dirty)
	}
}

// standInRDS is a PostgreSQL front door that takes TLS with a certificate
// of ca and asks for a clear-text password, as Aurora asks for an IAM
// token, then records the user and the password and refuses the login:
// enough to see what `muster migrate` presents, and over what.
type standInRDS struct {
	addr   string
	logins chan [2]string // user, password
}

func newStandInRDS(t *testing.T, ca *tlstest.CA) *standInRDS {
	t.Helper()
	certPEM, keyPEM := ca.Leaf(t, "writer", time.Hour)
	cert, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := &standInRDS{addr: ln.Addr().String(), logins: make(chan [2]string, 16)}
	var wg sync.WaitGroup
	t.Cleanup(func() { ln.Close(); wg.Wait() })
	wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			wg.Go(func() { defer c.Close(); s.serve(c, cert) })
		}
	})
	return s
}

func (s *standInRDS) serve(c net.Conn, cert tls.Certificate) {
	_ = c.SetDeadline(time.Now().Add(30 * time.Second))
	be := pgproto3.NewBackend(c, c)
	msg, err := be.ReceiveStartupMessage()
	if _, ok := msg.(*pgproto3.SSLRequest); err != nil || !ok {
		return // a client that does not ask for TLS gets nothing
	}
	if _, err := c.Write([]byte("S")); err != nil {
		return
	}
	tc := tls.Server(c, &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12})
	be = pgproto3.NewBackend(tc, tc)
	msg, err = be.ReceiveStartupMessage()
	startup, ok := msg.(*pgproto3.StartupMessage)
	if err != nil || !ok {
		return
	}
	be.Send(&pgproto3.AuthenticationCleartextPassword{})
	if be.Flush() != nil || be.SetAuthType(pgproto3.AuthTypeCleartextPassword) != nil {
		return
	}
	msg, err = be.Receive()
	pw, ok := msg.(*pgproto3.PasswordMessage)
	if err != nil || !ok {
		return
	}
	s.logins <- [2]string{startup.Parameters["user"], pw.Password}
	be.Send(&pgproto3.ErrorResponse{Severity: "FATAL", Code: "28P01", Message: "stand-in: login recorded, refused"})
	_ = be.Flush()
}

// TestMigrateTakesTheIAMPath: with MUSTER_DB_IAM=1 `muster migrate`
// connects as serve does: only with sslmode=verify-full against the CA
// bundle (sslmode=require is refused before any connection), over TLS,
// presenting an IAM token aws-sdk-go-v2 signed for the URL's user and
// endpoint as the password. The stand-in credentials are made-up values
// and no AWS endpoint is called; the stand-in server records the login.
// The token never appears in the command's error or output.
// (Not parallel: the command reads the environment.)
func TestMigrateTakesTheIAMPath(t *testing.T) {
	t.Setenv("AWS_ACCESS_KEY_ID", "AKIDSTANDINEXAMPLE")
	t.Setenv("AWS_SECRET_ACCESS_KEY", "stand-in-secret-not-a-real-key")
	t.Setenv("AWS_CONFIG_FILE", "/dev/null")
	t.Setenv("AWS_SHARED_CREDENTIALS_FILE", "/dev/null")
	t.Setenv("AWS_EC2_METADATA_DISABLED", "true")
	t.Setenv("AWS_REGION", "")
	t.Setenv("MUSTER_DB_IAM_REGION", "eu-west-1")
	t.Setenv("PGSSLMODE", "")
	t.Setenv("PGSSLROOTCERT", "")
	t.Setenv("MUSTER_DB_IAM", "1")
	ca := tlstest.NewCA(t)
	bundle := filepath.Join(t.TempDir(), "global-bundle.pem")
	tlstest.WriteFile(t, bundle, ca.PEM)
	rds := newStandInRDS(t, ca)
	base := "postgres://muster_app@" + rds.addr + "/muster?connect_timeout=10&sslrootcert=" + bundle

	// sslmode=require would hand the token to whoever answers: refused,
	// and nothing is sent.
	t.Setenv("DATABASE_URL", base+"&sslmode=require")
	if _, _, err := runCmd(t, "migrate", "up"); err == nil || !strings.Contains(err.Error(), "sslmode=verify-full") {
		t.Fatalf("migrate up with IAM and sslmode=require: %v, want the verify-full refusal", err)
	}
	select {
	case l := <-rds.logins:
		t.Fatalf("a login was sent under sslmode=require: user %s", l[0])
	default:
	}

	t.Setenv("DATABASE_URL", base+"&sslmode=verify-full")
	out, errOut, err := runCmd(t, "migrate", "up")
	if err == nil {
		t.Fatal("migrate up against the stand-in, which refuses every login, succeeded")
	}
	var login [2]string
	select {
	case login = <-rds.logins:
	default:
		t.Fatalf("no login reached the stand-in over TLS: %v", err)
	}
	user, tok := login[0], login[1]
	if user != "muster_app" {
		t.Errorf("logged in as %q, want muster_app", user)
	}
	for _, want := range []string{rds.addr + "?", "Action=connect", "DBUser=muster_app", "X-Amz-Credential=AKIDSTANDINEXAMPLE%2F", "%2Feu-west-1%2Frds-db%2Faws4_request", "X-Amz-Signature="} {
		if !strings.Contains(tok, want) {
			t.Errorf("the password presented is not an IAM token for the endpoint: it lacks %q", want)
		}
	}
	if strings.Contains(err.Error()+out+errOut, "X-Amz-Signature") {
		t.Error("the token appears in the command's error or output")
	}
}

// TestStartWithMigrateSkip: with MUSTER_MIGRATE=skip (a migrations Job
// applies them) a start never migrates. On a schema behind this release
// it exits at once saying the Job has not finished; on a dirty one (the
// Job still running, or stopped half-way) it exits saying so and how to
// clear it; neither is changed (a replica must never repair what the Job
// may be running). On a schema at this release's last migration it
// serves. A value other than up or skip is refused. (Not parallel: the
// start reads DATABASE_URL.)
func TestStartWithMigrateSkip(t *testing.T) {
	ctx := context.Background()
	u := dbtest.URL(t)
	t.Setenv("DATABASE_URL", u)
	t.Setenv("MUSTER_MIGRATE", "skip")
	conn, err := pgx.Connect(ctx, u)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	last, err := db.LatestMigration()
	if err != nil {
		t.Fatal(err)
	}
	setVersion := func(v uint, dirty bool) {
		t.Helper()
		if _, err := conn.Exec(ctx, `UPDATE schema_migrations SET version = $1, dirty = $2`, v, dirty); err != nil {
			t.Fatal(err)
		}
	}
	dir := devDir(t)
	for _, tc := range []struct {
		version uint
		dirty   bool
		want    []string
	}{
		{last - 1, false, []string{"MUSTER_MIGRATE=skip", fmt.Sprintf("at version %d, behind this release's last migration %d", last-1, last), "migrations Job"}},
		{last, true, []string{"MUSTER_MIGRATE=skip", fmt.Sprintf("dirty at version %d", last), "muster migrate up", "muster migrate force VERSION"}},
	} {
		setVersion(tc.version, tc.dirty)
		_, stderr, err := runCmd(t, "dev", "--addr", "127.0.0.1:0", "--data", dir)
		if err == nil {
			t.Fatalf("a start on version %d dirty %v with MUSTER_MIGRATE=skip did not fail:\n%s", tc.version, tc.dirty, stderr)
		}
		for _, w := range tc.want {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("the refusal at version %d dirty %v: %v, want it to say %q", tc.version, tc.dirty, err, w)
			}
		}
		var v uint
		var dirty bool
		if err := conn.QueryRow(ctx, `SELECT version, dirty FROM schema_migrations`).Scan(&v, &dirty); err != nil || v != tc.version || dirty != tc.dirty {
			t.Fatalf("after the refused start: version %d dirty %v (%v), want %d %v untouched", v, dirty, err, tc.version, tc.dirty)
		}
	}

	// The Job has finished: the start serves.
	setVersion(last, false)
	d := startDev(t, dir)
	if code, _ := call(t, "GET", d.url+"/healthz", "", ""); code != http.StatusOK {
		t.Errorf("healthz on a current schema with MUSTER_MIGRATE=skip: %d", code)
	}
	d.stop()

	t.Setenv("MUSTER_MIGRATE", "later")
	if _, _, err := runCmd(t, "dev", "--addr", "127.0.0.1:0", "--data", dir); err == nil || !strings.Contains(err.Error(), `MUSTER_MIGRATE "later"`) {
		t.Errorf("MUSTER_MIGRATE=later: %v, want a refusal naming it", err)
	}
}

// TestIAMWithoutRootCertTrustsOnlyRDS: with MUSTER_DB_IAM=1 and no
// sslrootcert, `muster migrate` verifies the server against the RDS CA
// bundle built in, not against nothing and not against the system roots:
// a stand-in server whose certificate a test CA signed (valid for its
// address, so only the authority is wrong) is refused with "unknown
// authority", the error naming the built-in bundle and the way out, and
// no login, so no token, reaches it. (Not parallel: the
// command reads the environment.)
func TestIAMWithoutRootCertTrustsOnlyRDS(t *testing.T) {
	t.Setenv("AWS_ACCESS_KEY_ID", "AKIDSTANDINEXAMPLE")
	t.Setenv("AWS_SECRET_ACCESS_KEY", "stand-in-secret-not-a-real-key")
	t.Setenv("AWS_CONFIG_FILE", "/dev/null")
	t.Setenv("AWS_SHARED_CREDENTIALS_FILE", "/dev/null")
	t.Setenv("AWS_EC2_METADATA_DISABLED", "true")
	t.Setenv("AWS_REGION", "")
	t.Setenv("MUSTER_DB_IAM_REGION", "eu-west-1")
	t.Setenv("PGSSLMODE", "")
	t.Setenv("PGSSLROOTCERT", "")
	t.Setenv("MUSTER_DB_IAM", "1")
	rds := newStandInRDS(t, tlstest.NewCA(t))
	t.Setenv("DATABASE_URL", "postgres://muster_app@"+rds.addr+"/muster?connect_timeout=10&sslmode=verify-full")
	_, _, err := runCmd(t, "migrate", "up")
	if err == nil || !strings.Contains(err.Error(), "unknown authority") || !strings.Contains(err.Error(), "built into muster, "+rdsca.Info().Package) {
		t.Fatalf("migrate up against a server of another CA: %v, want the certificate refused (unknown authority), naming the built-in bundle", err)
	}
	select {
	case l := <-rds.logins:
		t.Fatalf("a login reached a server the RDS bundle does not vouch for: user %s", l[0])
	default:
	}
}
