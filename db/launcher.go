package db

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/url"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// ErrNoPostgres means no PostgreSQL server binaries were found.
var ErrNoPostgres = errors.New("no PostgreSQL server binaries (initdb, pg_ctl) found in PATH or /usr/lib/postgresql/*/bin: " +
	"install the server package (Debian/Ubuntu: apt-get install postgresql) or set DATABASE_URL to an existing database")

// Cluster is a private PostgreSQL cluster started from the system's server
// binaries, listening only on a Unix socket inside its own folder. It is the
// embedded default of `muster dev` and of the tests.
//
// Several processes may use one cluster (two `muster dev` on one folder, a
// tool command next to them), and the one that started it may be gone
// (SIGKILLed) while the server runs on. So no process owns the cluster for
// good: each holds a shared flock(2) on the folder's cluster.lock while it
// uses it, and the last one out stops it. The kernel drops a process's lock
// when it dies, however it dies, so a lock held is a live user, with none
// of a pid file's staleness or pid reuse.
type Cluster struct {
	dataDir   string
	socketDir string
	binDir    string
	cred      *syscall.Credential
	logFile   string
	// started is false when the server was already running (another muster
	// process on the same folder, or one left by a killed process) and was
	// adopted rather than started.
	started bool
	// lock holds the shared lock on lockFile until Stop; nil after it.
	lock *os.File
}

// lockFile is the file in a cluster's folder whose flock marks the
// processes using the cluster.
const lockFile = "cluster.lock"

// ClusterConfig configures a local cluster.
type ClusterConfig struct {
	// Dir holds the cluster's data ("pgdata") and socket folders. It is
	// created if missing and reused when it already holds a cluster.
	Dir string
	// Fast turns off fsync and full-page writes: for throwaway test
	// clusters only, never for `muster dev` data a developer keeps.
	Fast bool
}

// StartCluster initialises the cluster in cfg.Dir if needed and starts it.
// As root it runs initdb and the server as the postgres user, since initdb
// refuses to run as root.
//
// The cluster is the caller's to Stop: whether this call started it or
// adopted one already running, Stop shuts it down unless another live
// process is still using it. A call that finds another process stopping
// the cluster waits for it to finish, then starts it again.
func StartCluster(ctx context.Context, cfg ClusterConfig) (*Cluster, error) {
	dir, err := filepath.Abs(cfg.Dir)
	if err != nil {
		return nil, fmt.Errorf("cluster dir: %w", err)
	}
	c, err := newCluster(dir)
	if err != nil {
		return nil, err
	}
	// A Unix socket path is limited to about 107 bytes; keep the socket in
	// the cluster folder when it fits and in a short temp folder otherwise.
	c.socketDir = filepath.Join(dir, "run")
	if len(c.socketDir)+len("/.s.PGSQL.5432") > 100 {
		c.socketDir, err = os.MkdirTemp("", "mpg")
		if err != nil {
			return nil, fmt.Errorf("socket dir: %w", err)
		}
	}
	uid, gid := -1, -1
	if c.cred != nil {
		uid, gid = int(c.cred.Uid), int(c.cred.Gid)
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("cluster dir: %w", err)
	}
	for _, d := range []string{c.dataDir, c.socketDir} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			return nil, fmt.Errorf("cluster dir: %w", err)
		}
		if c.cred != nil {
			if err := os.Chown(d, uid, gid); err != nil {
				return nil, fmt.Errorf("hand %s to the postgres user: %w", d, err)
			}
		}
	}
	if c.cred != nil {
		if err := touchOwned(c.logFile, uid, gid); err != nil {
			return nil, err
		}
	}

	if _, err := os.Stat(filepath.Join(c.dataDir, "PG_VERSION")); errors.Is(err, os.ErrNotExist) {
		args := []string{"-D", c.dataDir, "-U", "postgres", "-A", "trust", "-E", "UTF8", "--locale=C"}
		if cfg.Fast {
			args = append(args, "--no-sync")
		}
		if out, err := c.run(ctx, "initdb", args...); err != nil {
			return nil, fmt.Errorf("initdb: %w: %s", err, lastLines(out, 10))
		}
	}

	opts := []string{
		"-c listen_addresses=''",
		"-c unix_socket_directories=" + c.socketDir,
		"-c max_connections=200",
	}
	if cfg.Fast {
		opts = append(opts, "-c fsync=off", "-c full_page_writes=off", "-c synchronous_commit=off")
	}
	// Registered as a user before looking, so a process stopping the
	// cluster as its last user cannot stop the server this one adopts.
	if c.lock, err = lockShared(ctx, filepath.Join(dir, lockFile)); err != nil {
		return nil, err
	}
	// A server already running on this folder (a `muster dev` next door,
	// or one left by a killed process) is adopted, never started twice.
	if _, err := c.run(ctx, "pg_ctl", "-D", c.dataDir, "status"); err == nil {
		if sock := runningSocketDir(c.dataDir); sock != "" {
			c.socketDir = sock
			return c, nil
		}
	}
	out, err := c.run(ctx, "pg_ctl", "-D", c.dataDir, "-l", c.logFile, "-w", "-t", "60",
		"-o", strings.Join(opts, " "), "start")
	if err != nil {
		c.unlock()
		log, _ := os.ReadFile(c.logFile)
		return nil, fmt.Errorf("start postgres: %w: %s %s", err, lastLines(out, 5), lastLines(log, 10))
	}
	c.started = true
	return c, nil
}

// newCluster describes the cluster in dir without touching it.
func newCluster(dir string) (*Cluster, error) {
	binDir, err := findBinDir()
	if err != nil {
		return nil, err
	}
	c := &Cluster{
		dataDir: filepath.Join(dir, "pgdata"),
		binDir:  binDir,
		logFile: filepath.Join(dir, "postgres.log"),
	}
	if os.Geteuid() == 0 {
		u, err := user.Lookup("postgres")
		if err != nil {
			return nil, fmt.Errorf("running as root needs a postgres user to run the cluster as (initdb refuses root): %w", err)
		}
		uid, _ := strconv.Atoi(u.Uid)
		gid, _ := strconv.Atoi(u.Gid)
		c.cred = &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}
	}
	return c, nil
}

// lockShared opens path and takes a shared flock on it, waiting while a
// process holds it exclusively (it is stopping the cluster).
func lockShared(ctx context.Context, path string) (*os.File, error) {
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		return nil, fmt.Errorf("open cluster lock: %w", err)
	}
	wait := time.NewTicker(20 * time.Millisecond)
	defer wait.Stop()
	for {
		err := syscall.Flock(int(f.Fd()), syscall.LOCK_SH|syscall.LOCK_NB)
		if err == nil {
			return f, nil
		}
		if !errors.Is(err, syscall.EWOULDBLOCK) && !errors.Is(err, syscall.EINTR) {
			f.Close()
			return nil, fmt.Errorf("lock %s: %w", path, err)
		}
		select {
		case <-ctx.Done():
			f.Close()
			return nil, fmt.Errorf("wait for the cluster to stop (%s held): %w", path, ctx.Err())
		case <-wait.C:
		}
	}
}

// lastUser reports whether no other process uses the cluster, by turning
// this process's shared lock exclusive. Linux drops the shared lock when
// the conversion fails, so the lock is only good for closing afterwards.
func (c *Cluster) lastUser() bool {
	return syscall.Flock(int(c.lock.Fd()), syscall.LOCK_EX|syscall.LOCK_NB) == nil
}

func (c *Cluster) unlock() {
	if c.lock != nil {
		c.lock.Close() // closing the last descriptor releases the flock
		c.lock = nil
	}
}

// URL returns a connection URL for database name on this cluster.
func (c *Cluster) URL(database string) string {
	q := url.Values{"host": {c.socketDir}, "user": {"postgres"}, "sslmode": {"disable"}}
	return "postgres:///" + url.PathEscape(database) + "?" + q.Encode()
}

// DataDir is the cluster's data folder (where postmaster.pid lives).
func (c *Cluster) DataDir() string { return c.dataDir }

// Adopted reports whether the server was already running when
// StartCluster was called.
func (c *Cluster) Adopted() bool { return !c.started }

// Stop shuts the cluster down (fast mode: sessions are disconnected) if no
// other live process is using it, whether this one started it or adopted
// it (from a killed `muster dev`, say); otherwise it leaves the cluster
// running for the others, the last of which will stop it. Either way this
// process stops using it. Safe to call twice.
func (c *Cluster) Stop() error {
	if c.lock == nil {
		return nil
	}
	defer c.unlock()
	if !c.lastUser() {
		return nil
	}
	// Holding the lock exclusively: no process can adopt the server while
	// it stops; one starting now waits, then starts it anew.
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	return c.stop(ctx)
}

// stop stops the server if it is running.
func (c *Cluster) stop(ctx context.Context) error {
	if !c.running(ctx) {
		return nil
	}
	if out, err := c.run(ctx, "pg_ctl", "-D", c.dataDir, "-m", "fast", "-w", "stop"); err != nil {
		return fmt.Errorf("stop postgres: %w: %s", err, lastLines(out, 5))
	}
	return nil
}

// running asks pg_ctl whether a server runs on the data folder.
func (c *Cluster) running(ctx context.Context) bool {
	_, err := c.run(ctx, "pg_ctl", "-D", c.dataDir, "status")
	return err == nil
}

// EnsureDatabase creates database name if it does not exist.
func (c *Cluster) EnsureDatabase(ctx context.Context, name string) error {
	pool, err := Open(ctx, c.URL("postgres"))
	if err != nil {
		return err
	}
	defer pool.Close()
	var exists bool
	if err := pool.QueryRow(ctx, "SELECT EXISTS (SELECT 1 FROM pg_database WHERE datname = $1)", name).Scan(&exists); err != nil {
		return fmt.Errorf("look up database %s: %w", name, err)
	}
	if exists {
		return nil
	}
	if _, err := pool.Exec(ctx, "CREATE DATABASE "+quoteIdent(name)); err != nil {
		return fmt.Errorf("create database %s: %w", name, err)
	}
	return nil
}

func (c *Cluster) run(ctx context.Context, name string, args ...string) ([]byte, error) {
	cmd := exec.CommandContext(ctx, filepath.Join(c.binDir, name), args...)
	cmd.Dir = os.TempDir()
	if c.cred != nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: c.cred}
	}
	// pg_ctl start leaves the server running; it must not hold our stdout
	// or the command would never return.
	var buf bytes.Buffer
	cmd.Stdout, cmd.Stderr = &buf, &buf
	cmd.Env = append(os.Environ(), "LC_ALL=C")
	err := cmd.Run()
	return buf.Bytes(), err
}

// runningSocketDir reads the socket folder of a running server from its
// postmaster.pid (fifth line).
func runningSocketDir(dataDir string) string {
	b, err := os.ReadFile(filepath.Join(dataDir, "postmaster.pid"))
	if err != nil {
		return ""
	}
	lines := strings.Split(string(b), "\n")
	if len(lines) < 5 {
		return ""
	}
	return strings.TrimSpace(lines[4])
}

func findBinDir() (string, error) {
	if p, err := exec.LookPath("pg_ctl"); err == nil {
		if real, err := filepath.EvalSymlinks(p); err == nil {
			p = real
		}
		dir := filepath.Dir(p)
		if _, err := os.Stat(filepath.Join(dir, "initdb")); err == nil {
			return dir, nil
		}
	}
	matches, _ := filepath.Glob("/usr/lib/postgresql/*/bin/pg_ctl")
	if len(matches) > 0 {
		// Highest major version wins; Glob sorts lexically, so compare numbers.
		best, bestV := "", -1
		for _, m := range matches {
			v, _ := strconv.Atoi(filepath.Base(filepath.Dir(filepath.Dir(m))))
			if v > bestV {
				best, bestV = filepath.Dir(m), v
			}
		}
		return best, nil
	}
	return "", ErrNoPostgres
}

func touchOwned(path string, uid, gid int) error {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return fmt.Errorf("create %s: %w", path, err)
	}
	f.Close()
	if err := os.Chown(path, uid, gid); err != nil {
		return fmt.Errorf("hand %s to the postgres user: %w", path, err)
	}
	return nil
}

func lastLines(b []byte, n int) string {
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, " | ")
}

func quoteIdent(s string) string {
	return `"` + strings.ReplaceAll(s, `"`, `""`) + `"`
}

// StopDir stops whatever cluster is running on dir, whoever is using it;
// it does nothing when none is running.
func StopDir(ctx context.Context, dir string) error {
	c, err := clusterIn(dir)
	if err != nil {
		return err
	}
	return c.stop(ctx)
}

// ClusterRunning reports whether a cluster is running on dir.
func ClusterRunning(ctx context.Context, dir string) (bool, error) {
	c, err := clusterIn(dir)
	if err != nil {
		return false, err
	}
	return c.running(ctx), nil
}

func clusterIn(dir string) (*Cluster, error) {
	abs, err := filepath.Abs(dir)
	if err != nil {
		return nil, fmt.Errorf("cluster dir: %w", err)
	}
	return newCluster(abs)
}
