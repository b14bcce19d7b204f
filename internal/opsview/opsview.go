// Package opsview holds the wire shapes of the operator's views: a holder, and the answers
// of revoke, revoke-pod, sweep and reconcile, as the operator API serves them and as
// kubectl lease prints them with -o json. It imports only the domain types, so the plugin
// links none of the manager's machinery for them.
package opsview

import (
	"time"

	"github.com/vancetope/lease-operator/internal/lease"
)

// HolderView is a holder as the operator's tools show it: named by its public ID, never
// by its token (docs/live-api.md, "Holder IDs").
type HolderView struct {
	ID    string `json:"id"`
	State string `json:"state"`
	// Lease is the definition's name; for a holder of several resources, the parts' names
	// joined by "+" (Parts has each).
	Lease string `json:"lease"`
	// Resource is the resource the holder books; for a holder of several resources, the
	// parts' resources joined by "+".
	Resource  string `json:"resource"`
	Type      string `json:"type"`
	Tenant    string `json:"tenant"`
	Project   string `json:"project"`
	User      string `json:"user,omitempty"`
	HolderRef string `json:"holderRef,omitempty"`
	// Pod is namespace/name; empty for a holder without a pod.
	Pod      string            `json:"pod,omitempty"`
	PodUID   string            `json:"podUID,omitempty"`
	PodBound bool              `json:"podBound"`
	Payload  map[string]string `json:"payload,omitempty"`
	// Levels are the counter keys the holder had booked and that were returned.
	Levels     []string  `json:"levels"`
	AcquiredAt time.Time `json:"acquiredAt,omitzero"`
	LastSeenAt time.Time `json:"lastSeenAt,omitzero"`
	// Fence is the grant's fencing token (0 before the grant); for a holder of several
	// resources, the first part's.
	Fence int64 `json:"fence,omitempty"`
	// Parts are the resources of a holder that books several at once, in the order of their
	// resources, each with its fence (docs/waiting.md, "Several resources at once"); absent
	// for a holder of one.
	Parts []PartView `json:"parts,omitempty"`
	// Borrowed: the tenant slot was granted above the tenant cap (docs/borrowing.md).
	Borrowed bool `json:"borrowed,omitempty"`
}

// PartView is one resource of a holder that books several.
type PartView struct {
	Lease    string `json:"lease"`
	Resource string `json:"resource"`
	// Fence is the part's fencing token (0 before the grant).
	Fence int64 `json:"fence,omitempty"`
}

// HolderViewOf renders a holder as the operator API (and kubectl lease) shows it.
func HolderViewOf(h lease.Holder) HolderView {
	levels := h.Levels
	if levels == nil {
		levels = []string{}
	}
	return HolderView{
		ID:         h.ID,
		State:      string(h.State),
		Lease:      h.LeaseNames(),
		Resource:   h.Resources(),
		Type:       h.Type,
		Tenant:     h.Tenant,
		Project:    h.Project,
		User:       h.User,
		HolderRef:  h.HolderRef,
		Pod:        h.Pod.String(),
		PodUID:     h.Pod.UID,
		PodBound:   h.PodBound,
		Payload:    h.Payload,
		Levels:     levels,
		AcquiredAt: h.AcquiredAt.UTC(),
		LastSeenAt: h.LastSeenAt.UTC(),
		Fence:      h.Fence,
		Parts:      partViews(h.Parts),
		Borrowed:   h.Borrowed,
	}
}

func partViews(parts []lease.Part) []PartView {
	if len(parts) == 0 {
		return nil
	}
	out := make([]PartView, len(parts))
	for i, p := range parts {
		out[i] = PartView{Lease: p.LeaseName, Resource: p.Resource, Fence: p.Fence}
	}
	return out
}

// HolderViews renders holders with HolderViewOf.
func HolderViews(hs []lease.Holder) []HolderView {
	out := make([]HolderView, 0, len(hs))
	for _, h := range hs {
		out = append(out, HolderViewOf(h))
	}
	return out
}

// RevokeResult is the answer of revoke.
type RevokeResult struct {
	Revoked bool       `json:"revoked"`
	Holder  HolderView `json:"holder"`
}

// RevokePodResult is the answer of revoke-pod; Revoked is len(Holders), 0 when the pod held
// nothing.
type RevokePodResult struct {
	Revoked int          `json:"revoked"`
	Holders []HolderView `json:"holders"`
}

// ReconcileView is the answer of reconcile (the store's ReconcileResult).
type ReconcileView struct {
	Corrected int `json:"corrected"`
	Deleted   int `json:"deleted"`
	Skipped   int `json:"skipped"`
	// Repaired: entries removed because the holder they name was gone.
	Repaired int `json:"repaired,omitempty"`
	// Unmarked: holders whose borrowed mark was dropped (their tenant back within its cap).
	Unmarked int `json:"unmarked,omitempty"`
}

// SweepView is the answer of sweep (the sweeper's Result): holders reaped idle, holders of dead
// pods reaped, and the reconcile of the round.
type SweepView struct {
	Idle      int           `json:"idle"`
	Pod       int           `json:"pod"`
	Reconcile ReconcileView `json:"reconcile"`
}
