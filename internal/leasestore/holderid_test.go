package leasestore_test

import (
	"errors"
	"slices"
	"testing"

	"github.com/google/go-cmp/cmp"
	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"

	"github.com/vancetope/lease-operator/internal/lease"
	"github.com/vancetope/lease-operator/internal/leasestore"
	"github.com/vancetope/lease-operator/internal/testutil/mongotest"
)

// TestHolderIDs: a holder carries its public ID from the acquisition on; get and revoke by
// ID find it (revoke with the tenant bound), the token is no ID, and pages run in ID order,
// their cursor an ID.
func TestHolderIDs(t *testing.T) {
	s := newStore(t)
	ctx := ctxT(t)
	h := mustAcquire(t, s, request("r", "acme", "p", "u", allCaps(9, 9, 9, 9)))
	if h.ID != lease.HolderID(h.Token) {
		t.Fatalf("acquired holder ID = %q, want HolderID of its token", h.ID)
	}
	got, err := s.GetHolderByID(ctx, h.ID)
	if err != nil || got.Token != h.Token || got.ID != h.ID {
		t.Fatalf("GetHolderByID = %+v, %v", got, err)
	}
	if _, err := s.GetHolderByID(ctx, h.Token); !errors.Is(err, lease.ErrLost) {
		t.Errorf("GetHolderByID(token) = %v, want ErrLost", err)
	}
	if _, ok, err := s.RevokeByID(ctx, h.ID, "globex"); err != nil || ok {
		t.Fatalf("revoke by ID for another tenant = %v, %v; want no match", ok, err)
	}
	if _, ok, err := s.RevokeByID(ctx, h.ID, "acme"); err != nil || !ok {
		t.Fatalf("revoke by ID = %v, %v", ok, err)
	}
	if err := s.Touch(ctx, h.Token); !errors.Is(err, lease.ErrLost) {
		t.Errorf("check after revoke by ID = %v, want ErrLost", err)
	}
	assertNoDrift(t, s)

	var ids []string
	for i := range 5 {
		ids = append(ids, mustAcquire(t, s, request("pg", "acme", "p", uniq("u", i), allCaps(9, 9, 9, 9))).ID)
	}
	slices.Sort(ids)
	var paged []string
	after := ""
	for {
		page, next, err := s.ListHoldersPage(ctx, leasestore.HolderFilter{Resource: "pg"}, after, 2)
		if err != nil {
			t.Fatal(err)
		}
		for _, p := range page {
			paged = append(paged, p.ID)
		}
		if next == "" {
			break
		}
		if !lease.ValidHolderID(next) {
			t.Fatalf("page cursor %q is no holder ID", next)
		}
		after = next
	}
	if d := cmp.Diff(ids, paged); d != "" {
		t.Errorf("pages (-want +got):\n%s", d)
	}
}

// TestExcludeTenants: the system namespace's store filter leaves out the tenants that have
// a namespace, so that its pages (and cursors) never reach their holders.
func TestExcludeTenants(t *testing.T) {
	s := newStore(t)
	ctx := ctxT(t)
	mustAcquire(t, s, request("x", "acme", "p", "u", allCaps(9, 9, 9, 9)))
	o := mustAcquire(t, s, request("x", "orphan", "p", "u", allCaps(9, 9, 9, 9)))
	page, next, err := s.ListHoldersPage(ctx, leasestore.HolderFilter{ExcludeTenants: []string{"acme", "globex"}}, "", 1)
	if err != nil {
		t.Fatal(err)
	}
	if len(page) != 1 || page[0].ID != o.ID || next != "" {
		t.Errorf("page = %v, next %q; want only the orphan's holder, no next", page, next)
	}
}

// TestHolderIDsBackfilled: a holder stored before IDs existed (no pid) gets its ID from
// EnsureIndexes and is then found by it.
func TestHolderIDsBackfilled(t *testing.T) {
	uri, err := mongotest.URI()
	if err != nil {
		t.Fatal(err)
	}
	db := mongotest.DatabaseName(t)
	s := newStoreAt(t, uri, db)
	ctx := ctxT(t)
	h := mustAcquire(t, s, request("old", "acme", "p", "u", allCaps(9, 9, 9, 9)))
	raw, err := mongo.Connect(options.Client().ApplyURI(uri))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = raw.Disconnect(ctxT(t)) })
	if _, err := raw.Database(db).Collection(leasestore.HoldersCollection).UpdateOne(ctx,
		bson.D{{Key: "_id", Value: h.Token}}, bson.D{{Key: "$unset", Value: bson.D{{Key: "pid", Value: ""}}}}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.GetHolderByID(ctx, h.ID); !errors.Is(err, lease.ErrLost) {
		t.Fatalf("legacy holder found by ID before the backfill: %v", err)
	}
	if got, err := s.GetHolder(ctx, h.Token); err != nil || got.ID != h.ID {
		t.Errorf("legacy holder read by token: ID %q, %v; want %q derived", got.ID, err, h.ID)
	}
	if err := s.EnsureIndexes(ctx); err != nil {
		t.Fatal(err)
	}
	if got, err := s.GetHolderByID(ctx, h.ID); err != nil || got.Token != h.Token {
		t.Errorf("after the backfill: %+v, %v", got, err)
	}
}
