"""The routers' languages: one subpackage per router (llm-d, Dynamo), each its rules and its
routes, over the same index reads as the REST API."""
