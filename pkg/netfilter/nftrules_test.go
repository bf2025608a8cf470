package netfilter

import (
	"errors"
	"fmt"
	"slices"
	"testing"

	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"github.com/google/nftables/userdata"
	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"
)

// nftTestChain makes table t and chain c in family ip with n rules, each
// commented "rule <i>", with google/nftables directly, and returns their
// handles in order.
func nftTestChain(t *testing.T, table, chain string, n int) []uint64 {
	t.Helper()
	comments := make([]string, n)
	for i := range comments {
		comments[i] = fmt.Sprintf("rule %d", i)
	}
	return nftTestRules(t, nftables.TableFamilyIPv4, table, chain, comments)
}

// nftTestRules makes a rule per comment in chain of table, family family.
func nftTestRules(t *testing.T, family nftables.TableFamily, table, chain string, comments []string) []uint64 {
	t.Helper()
	conn, err := nftables.New()
	if err != nil {
		t.Fatal(err)
	}
	tab := conn.AddTable(&nftables.Table{Family: family, Name: table})
	ch := conn.AddChain(&nftables.Chain{Table: tab, Name: chain})
	for i, comment := range comments {
		conn.AddRule(&nftables.Rule{Table: tab, Chain: ch,
			Exprs:    []expr.Any{&expr.Counter{}},
			UserData: userdata.AppendString(nil, userdata.TypeComment, comment),
		})
		// google/nftables sends a batch in one message and asks an
		// acknowledgement of each rule: keep both under the socket's
		// buffers.
		if i%100 == 99 {
			if err := conn.Flush(); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := conn.Flush(); err != nil {
		t.Fatal(err)
	}
	return nftHandles(t, conn, tab, ch)
}

// nftHandles lists a chain's rule handles through google/nftables.
func nftHandles(t *testing.T, conn *nftables.Conn, table *nftables.Table, chain *nftables.Chain) []uint64 {
	t.Helper()
	rules, err := conn.GetRules(table, chain)
	if err != nil {
		t.Fatal(err)
	}
	var out []uint64
	for _, r := range rules {
		out = append(out, r.Handle)
	}
	return out
}

func nftLeft(t *testing.T, table, chain string) []uint64 {
	t.Helper()
	conn, err := nftables.New()
	if err != nil {
		t.Fatal(err)
	}
	tab := &nftables.Table{Family: nftables.TableFamilyIPv4, Name: table}
	return nftHandles(t, conn, tab, &nftables.Chain{Table: tab, Name: chain})
}

// withNFT runs fn in a throw-away network namespace, with a socket to
// nftables dialled there.
func withNFT(t *testing.T, fn func(c *nftables.Conn)) {
	t.Helper()
	err := nftNamespace(t).Do(func(ns.NetNS) error {
		c, err := dialNFT()
		if err != nil {
			return err
		}
		defer c.CloseLasting()
		fn(c)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

func refsOf(table, chain string, handles ...uint64) []*nftables.Rule {
	tab := &nftables.Table{Family: nftables.TableFamilyIPv4, Name: table}
	out := make([]*nftables.Rule, len(handles))
	for i, h := range handles {
		out[i] = &nftables.Rule{Table: tab, Chain: &nftables.Chain{Table: tab, Name: chain}, Handle: h}
	}
	return out
}

// The listing lists what was made, with handles and comments, and a table
// or chain that does not exist has no rules.
func TestNFTListsRulesWithHandlesAndComments(t *testing.T) {
	withNFT(t, func(c *nftables.Conn) {
		handles := nftTestChain(t, "t", "c", 3)
		nftTestChain(t, "t", "other", 1)
		var got []string
		rules, err := listRules(c, nftables.TableFamilyIPv4, "t", "c")
		for _, r := range rules {
			comment, _ := udataComment(r.UserData)
			got = append(got, fmt.Sprintf("%s/%s %d %s", r.Table.Name, r.Chain.Name, r.Handle, comment))
		}
		want := []string{}
		for i, h := range handles {
			want = append(want, fmt.Sprintf("t/c %d rule %d", h, i))
		}
		if err != nil || !slices.Equal(got, want) {
			t.Fatalf("listing of t/c: %q, %v; want %q", got, err, want)
		}
		for _, where := range [][2]string{{"t", "missing"}, {"missing", "c"}} {
			if rules, err := listRules(c, nftables.TableFamilyIPv4, where[0], where[1]); err != nil || len(rules) != 0 {
				t.Errorf("listing of %q: %d rules, %v; want none, no error", where, len(rules), err)
			}
		}
		if rules, err := listRules(c, nftables.TableFamilyIPv6, "t", "c"); err != nil || len(rules) != 0 {
			t.Errorf("listing of ip6 t/c: %d rules, %v; want none (the table is ip's)", len(rules), err)
		}
	})
}

// More rules than one batch holds (a gc of a leaked /20) go in several
// batches, and all of them go: in one, the deletions of 4000 rules are
// over what one sendmsg can carry, and their acknowledgements over what
// the socket can receive.
func TestNFTDeleteRulesInSeveralBatches(t *testing.T) {
	withNFT(t, func(c *nftables.Conn) {
		const n = 4000
		if nftBatchRules >= n || nftBatchRules*548 > 64<<10 {
			t.Fatalf("a batch of %d deletions: want several for %d, each at most 64 KiB", nftBatchRules, n)
		}
		handles := nftTestChain(t, ipMasqTable, ipMasqChain, n)
		if err := deleteRules(c, refsOf(ipMasqTable, ipMasqChain, handles[:n-1]...)); err != nil {
			t.Fatalf("delete: %v", err)
		}
		if left := nftLeft(t, ipMasqTable, ipMasqChain); !slices.Equal(left, handles[n-1:]) {
			t.Fatalf("left: %v, want only %v", left, handles[n-1:])
		}
	})
}

// A batch is all or nothing, and its failure is reported: a rule gone
// since the listing (a plugin's own DEL won) fails the deletion of the
// others in its batch, which stay for the next listing.
func TestNFTDeleteRulesFailsWholeAndSaysSo(t *testing.T) {
	withNFT(t, func(c *nftables.Conn) {
		handles := nftTestChain(t, "t", "c", 3)
		gone := handles[2] + 1000
		err := deleteRules(c, refsOf("t", "c", handles[0], gone, handles[2]))
		if !errors.Is(err, unix.ENOENT) {
			t.Fatalf("delete with a rule that is not there: %v, want ENOENT", err)
		}
		if left := nftLeft(t, "t", "c"); !slices.Equal(left, handles) {
			t.Fatalf("after the failed batch: %v, want all of %v", left, handles)
		}
		// The socket is still in step: the next batch and its answer.
		if err := deleteRules(c, refsOf("t", "c", handles[0], handles[2])); err != nil {
			t.Fatalf("delete: %v", err)
		}
		if left := nftLeft(t, "t", "c"); !slices.Equal(left, handles[1:2]) {
			t.Fatalf("left: %v, want %v", left, handles[1:2])
		}
		if err := deleteRules(c, refsOf("missing", "c", 1)); !errors.Is(err, unix.ENOENT) {
			t.Fatalf("delete in a table that does not exist: %v, want ENOENT", err)
		}
	})
}

// google/nftables v0.3.0 formats a dump's receive error with %v: the
// errno is still told, from its text.
func TestIsErrnoThroughGetRulesFormatting(t *testing.T) {
	op := &netlink.OpError{Op: "receive", Err: unix.EPERM}
	for _, err := range []error{op, fmt.Errorf("receiveAckAware: %v", op), fmt.Errorf("x: %w", unix.EPERM)} {
		if !isErrno(err, unix.EPERM) {
			t.Errorf("isErrno(%q, EPERM) = false", err)
		}
		if isErrno(err, unix.ENOENT) {
			t.Errorf("isErrno(%q, ENOENT) = true", err)
		}
	}
	if isErrno(nil, unix.EPERM) || isErrno(errors.New("operation not permitted"), unix.EPERM) {
		t.Error("isErrno of nil or a bare text: true")
	}
}

// A gc that releases the nftables ipMasq rules of a leaked /20 (4000
// attachments) releases them all. Regression: the rules of every owner
// went in one batch, one sendmsg of over 300 KB, which netlink refused
// (EMSGSIZE), so each sweep failed again on the same owners.
func TestNFTablesReleaseOfALeakedSubnet(t *testing.T) {
	netns := nftNamespace(t)
	err := netns.Do(func(ns.NetNS) error {
		const n = 4000
		comments := make([]string, n)
		for i := range comments {
			comments[i] = nftComment("nomad", "eth0", fmt.Sprintf("%064x", i))
		}
		nftTestRules(t, nftables.TableFamilyINet, ipMasqTable, ipMasqChain, comments)
		var nft nftBackend
		rules, err := nft.List("nomad")
		if err != nil {
			t.Fatal(err)
		}
		var owners []string
		for _, o := range rules.Owners() {
			owners = append(owners, o.Owner)
		}
		if len(owners) != n {
			t.Fatalf("listed %d owners, want %d", len(owners), n)
		}
		removed, failed := rules.Release(owners)
		if len(failed) != 0 || len(removed) != n {
			t.Fatalf("released %d owners of %d; failed: %d (%v)", len(removed), n, len(failed), failed[owners[0]])
		}
		if left, err := nft.List("nomad"); err != nil || len(left.Owners()) != 0 {
			t.Fatalf("after the release: %d owners left (%v)", len(left.Owners()), err)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// A rule's userdata is anyone's: a TLV whose length runs past the end is
// no comment (userdata.Get, which the nftables release used, panics on it).
func TestUdataCommentOfMalformedUserdata(t *testing.T) {
	good := userdata.AppendString(userdata.AppendUint32(nil, 7, 42), userdata.TypeComment, "hi")
	if c, ok := udataComment(good); !ok || string(c) != "hi" {
		t.Fatalf("udataComment(%x) = %q, %v", good, c, ok)
	}
	for _, b := range [][]byte{nil, {0}, {0, 5, 'a'}, {7, 200, 1, 2}, append([]byte{7, 1, 0}, 0, 9, 'x')} {
		if c, ok := udataComment(b); ok {
			t.Errorf("udataComment(%x) = %q, want none", b, c)
		}
	}
}

// An xt comment match's info is NUL-terminated in 256 bytes: what
