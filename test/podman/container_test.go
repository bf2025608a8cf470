package podman

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strconv"
	"strings"
	"testing"
	"time"
)

// readyLine is what a container prints once its httpd listens (busybox
// httpd binds its socket before it daemonizes, so `httpd && echo` orders
// them). The shell then waits, and exits at once on SIGTERM: as PID 1 it
// would otherwise ignore it, and every stop would wait out the timeout.
const readyLine = "ready"

var serveScript = "httpd -p 80 -h /www || exit 1; echo " + readyLine + "; trap 'exit 0' TERM; while :; do sleep 3600 & wait; done"

// container is one the test runs: its name, ID, published host port (0:
// none) and how many times it has been started, which is how many ready
// lines its log holds once it serves.
type container struct {
	name     string
	id       string
	hostPort int
	starts   int
}

// runOpt adds options to `podman run`.
type runOpt func(c *container) []string

// withHostPort publishes the container's port 80 on a free host port.
func withHostPort(t *testing.T) runOpt {
	return func(c *container) []string {
		c.hostPort = freePort(t)
		return []string{"-p", fmt.Sprintf("%d:80", c.hostPort)}
	}
}

// withIP asks for a static address on the container's network.
func withIP(ip fmt.Stringer) runOpt {
	return func(*container) []string { return []string{"--ip", ip.String()} }
}

// run starts a container serving the env's token on port 80 of network n
// and waits until it listens.
func (e *env) run(t *testing.T, name string, n *network, opts ...runOpt) *container {
	t.Helper()
	c := &container{name: name + "-" + e.id}
	args := []string{"run", "-d", "--name", c.name, "--network", n.name, "--stop-timeout", "5"}
	for _, opt := range opts {
		args = append(args, opt(c)...)
	}
	args = append(args, e.image, "sh", "-c", serveScript)
	out, stderr, err := e.podmanOutput(args...)
	if err == nil && strings.TrimSpace(stderr) != "" {
		t.Logf("podman run %s printed on stderr:\n%s", c.name, stderr)
	}
	// A failed run may still have created the container: find it for
	// cleanup either way.
	if ins, ierr := e.inspect(c.name); ierr == nil {
		c.id = ins.ID
		e.noteContainer(c.id)
	}
	if err != nil {
		t.Fatal(err)
	}
	if c.id == "" || !strings.HasPrefix(c.id, strings.TrimSpace(out)) {
		t.Fatalf("podman run printed %q, inspect says ID %q", out, c.id)
	}
	e.waitReady(t, c)
	return c
}

// start, restart: podman verbs that run the container again; each waits
// until it serves.
func (e *env) start(t *testing.T, c *container) {
	t.Helper()
	e.mustPodman(t, "start", c.id)
	e.waitReady(t, c)
}

func (e *env) restart(t *testing.T, c *container) {
	t.Helper()
	e.mustPodman(t, "restart", c.id)
	e.waitReady(t, c)
}

// waitReady follows the container's log until it holds one ready line per
// start: the listener inside is up. It fails if the container exits first.
func (e *env) waitReady(t *testing.T, c *container) {
	t.Helper()
	c.starts++
	ctx, cancel := context.WithTimeout(context.Background(), cmdTimeout)
	defer cancel()
	cmd := e.command(ctx, "logs", "--follow", c.id)
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var stderr strings.Builder
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatalf("podman logs: %v", err)
	}
	defer func() {
		cancel()
		_ = cmd.Wait()
	}()
	seen := 0
	sc := bufio.NewScanner(stdout)
	for sc.Scan() {
		if strings.TrimSpace(sc.Text()) == readyLine {
			seen++
			if seen == c.starts {
				return
			}
		}
	}
	t.Fatalf("container %s: log ended after %d of %d ready lines (exited?): %v %s", c.name, seen, c.starts, sc.Err(), stderr.String())
}

// freePort is a TCP port nothing listens on now: podman's conmon binds the
// published host port, so it must be free.
func freePort(t *testing.T) int {
	t.Helper()
	ln, err := net.Listen("tcp", ":0")
	if err != nil {
		t.Fatalf("find a free port: %v", err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}

// fetch connects to addr (inside a namespace the test created, or
// loopback), sends an HTTP request for / and returns the body.
func fetch(addr string) (string, error) {
	conn, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		return "", err
	}
	defer conn.Close()
	if err := conn.SetDeadline(time.Now().Add(10 * time.Second)); err != nil {
		return "", err
	}
	if _, err := fmt.Fprintf(conn, "GET / HTTP/1.0\r\nHost: %s\r\n\r\n", addr); err != nil {
		return "", err
	}
	raw, err := io.ReadAll(conn)
	if err != nil {
		return "", err
	}
	head, body, ok := strings.Cut(string(raw), "\r\n\r\n")
	if !ok || !strings.Contains(strings.SplitN(head, "\r\n", 2)[0], " 200 ") {
		return "", errors.New("not an HTTP 200 answer: " + strconv.Quote(string(raw)))
	}
	return body, nil
}
