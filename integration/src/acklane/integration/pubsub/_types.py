"""The Pub/Sub request, response and resource classes, as ``google-cloud-pubsub`` ships
them (``google.pubsub_v1.types.X.pb()``): what the emulator reads and answers.
"""

from __future__ import annotations

from google.pubsub_v1 import types as t

__all__ = ["pb"]

pb = {
    name: getattr(t, name).pb()
    for name in (
        "Topic",
        "Subscription",
        "PubsubMessage",
        "PublishRequest",
        "PublishResponse",
        "GetTopicRequest",
        "ListTopicsRequest",
        "ListTopicsResponse",
        "ListTopicSubscriptionsRequest",
        "ListTopicSubscriptionsResponse",
        "DeleteTopicRequest",
        "GetSubscriptionRequest",
        "UpdateSubscriptionRequest",
        "ListSubscriptionsRequest",
        "ListSubscriptionsResponse",
        "DeleteSubscriptionRequest",
        "ModifyAckDeadlineRequest",
        "AcknowledgeRequest",
        "PullRequest",
        "PullResponse",
        "StreamingPullRequest",
        "StreamingPullResponse",
        "ReceivedMessage",
        "UpdateTopicRequest",
        "DetachSubscriptionRequest",
        "DetachSubscriptionResponse",
        "ModifyPushConfigRequest",
        "Snapshot",
        "CreateSnapshotRequest",
        "GetSnapshotRequest",
        "UpdateSnapshotRequest",
        "ListSnapshotsRequest",
        "ListSnapshotsResponse",
        "ListTopicSnapshotsRequest",
        "ListTopicSnapshotsResponse",
        "DeleteSnapshotRequest",
        "SeekRequest",
        "SeekResponse",
    )
}
